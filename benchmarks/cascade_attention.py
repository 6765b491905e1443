"""The embedded engine with cascade attention against without, side by side in one process.

GRPO's n samples of a prompt hold copies of its keys; with cascade a decode pass reads them once
per group, without it once per row (`asyncrl/inference/cascade_attention.py`). What that saves
grows with the prompt's share of the keys, so the workloads here take the real-model quick
start's prompts (reasoning-gym chain_sum through SmolLM2's chat template, ~50 tokens) and the
same prompts behind a longer system prompt (`--system-tokens`, instructions repeated to about
that many tokens, as a task with rules and examples would have). A workload `PxNxT` is P
prompts, one request each with `n = N`, T tokens per sample (EOS ignored), at temperature 0.7.

Two engines on two copies of the model run in this process, one thread on one core; each round
runs every workload once on each engine, which goes first alternating by round. The ratio's
interval is a percentile bootstrap over rounds. Prints one JSON line.

    PYTHONPATH=src:benchmarks python benchmarks/cascade_attention.py \
        [--model models/smollm2-135m-instruct] [--workloads 8x8x128 8x8x64] \
        [--system-tokens 0 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.envs.reasoning_gym_tasks import ReasoningGymEnv
from asyncrl.heap import keep_freed_memory
from asyncrl.inference.engine import Engine
from asyncrl.inference.sampling import SamplingParams
from machine import cpu_name
from race_stats import bootstrap_ratio
from real_model_generation import QUICK_START_ENV, TEMPERATURE

RULE = (
    "Read the question carefully. Add the numbers in the order given. Check the sign of each "
    "term before you add it. Give the final result as a plain integer. "
)


def prompts(tokenizer: AutoTokenizer, count: int, system_tokens: int) -> list[list[int]]:
    """The quick start's prompts; with `system_tokens`, behind a system prompt of the quick
    start's own text and rules repeated to at least that many tokens."""
    system = QUICK_START_ENV["system_prompt"]
    while system_tokens and len(tokenizer(system)["input_ids"]) < system_tokens:
        system = f"{system} {RULE}"
    env = ReasoningGymEnv("chain_sum", **{**QUICK_START_ENV, "system_prompt": system})
    return [
        list(tokenizer.apply_chat_template(e.prompt, add_generation_prompt=True)["input_ids"])
        for e in env.examples("eval", count)
    ]


def tokens_per_second(engine: Engine, batch: list[list[int]], n: int, tokens: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=TEMPERATURE, ignore_eos=True)
    started = time.perf_counter()
    requests = [engine.submit(prompt, params, n=n) for prompt in batch]
    produced = sum(len(o.token_ids) for r in requests for o in r.done.result(timeout=3600))
    assert produced == len(batch) * n * tokens, produced
    return produced / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=Path("models/smollm2-135m-instruct"))
    parser.add_argument("--workloads", nargs="+", default=["8x8x128", "8x8x64"])
    parser.add_argument("--system-tokens", nargs="+", type=int, default=[0, 300])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    torch.set_num_threads(1)
    keep_freed_memory()  # as every asyncrl role does
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    shapes = [tuple(int(part) for part in w.split("x")) for w in args.workloads]
    cases = [(system, shape) for system in args.system_tokens for shape in shapes]
    batches = {system: prompts(tokenizer, max(p for p, _, _ in shapes), system)
               for system in args.system_tokens}  # fmt: skip
    longest = max(len(p) for batch in batches.values() for p in batch) + max(t for *_, t in shapes)
    engines = {}
    for cascade in (True, False):
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        engines[cascade] = Engine(
            model, tokenizer, max_num_seqs=max(p * n for p, n, _ in shapes),
            max_model_len=longest + 1, cascade=cascade,
        )  # fmt: skip
        assert engines[cascade].cascade is cascade
    rates: dict[tuple[int, bool, str], list[float]] = {}
    try:
        for system, _ in cases:  # warm-up
            for engine in engines.values():
                tokens_per_second(engine, batches[system][:2], 2, 4)
        for round_index in range(args.rounds):
            order = (True, False) if round_index % 2 == 0 else (False, True)
            for system, (count, n, tokens) in cases:
                for cascade in order:
                    key = (system, cascade, f"{count}x{n}x{tokens}")
                    rate = tokens_per_second(engines[cascade], batches[system][:count], n, tokens)
                    rates.setdefault(key, []).append(rate)
    finally:
        for engine in engines.values():
            engine.shutdown()
    results = {}
    for system, (count, n, tokens) in cases:
        workload = f"{count}x{n}x{tokens}"
        on, off = rates[(system, True, workload)], rates[(system, False, workload)]
        mean, low, high = bootstrap_ratio(on, off)
        results[f"{workload} prompt {len(batches[system][0])}"] = {
            "cascade_tok_s": round(statistics.median(on), 1),
            "plain_tok_s": round(statistics.median(off), 1),
            "cascade_over_plain": [round(mean, 3), round(low, 3), round(high, 3)],
        }
    print(json.dumps({"benchmark": "cascade_attention", "cpu": cpu_name(), "threads": 1,
                      "rounds": args.rounds, "results": results}))  # fmt: skip


if __name__ == "__main__":
    main()
