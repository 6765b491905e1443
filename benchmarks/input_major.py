"""The embedded engine with its linear weights input-major (`inference/input_major.py`) against
the same engine with them as loaded, side by side in one process.

Two engines on two copies of the model (float32, one thread, pinned to one core), each on its
own engine thread: `--rows` sequences in groups of 8 sharing a prompt (as the orchestrator asks),
submitted while the engine is paused and released together, `--tokens` tokens each with EOS
ignored; a round is timed from the release to the last completion. Rounds alternate between the two,
`--repeats` times after a warm-up round each; the JSON line gives each side's median tokens/s
and the speed-up (mean round time plain ÷ input-major) with a bootstrap 95 % interval over the
rounds, per row count.

    PYTHONPATH=src:benchmarks python benchmarks/input_major.py \
        --model models/smollm2-135m-instruct --rows 16 32 40 64 --repeats 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from asyncrl.inference.engine import Engine
from asyncrl.inference.input_major import lay_out_input_major
from asyncrl.inference.sampling import SamplingParams
from machine import cpu_name
from race_stats import bootstrap_ratio

GROUP = 8


def started_engine(path: Path, tokenizer: PreTrainedTokenizerBase, input_major: bool) -> Engine:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if input_major:
        assert lay_out_input_major(model) > 0
    return Engine(model, tokenizer, max_num_seqs=128, max_model_len=256)


def prompts(tokenizer: PreTrainedTokenizerBase, groups: int) -> list[list[int]]:
    texts = [
        f"Write the calculation, then the result in answer tags.\nWhat is {i} + {i + 3}?"
        for i in range(groups)
    ]
    chats = [[{"role": "user", "content": text}] for text in texts]
    return [
        list(
            tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)[
                "input_ids"
            ]
        )
        for chat in chats
    ]


def round_seconds(engine: Engine, prompt_ids: list[list[int]], tokens: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0.7, ignore_eos=True, logprobs=0)
    engine.pause("keep")  # held until all are in: one prefill, as a batch of groups arrives
    requests = [engine.submit(ids, params, n=GROUP) for ids in prompt_ids]
    started = time.perf_counter()
    engine.resume()
    for request in requests:
        request.done.result(timeout=600)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=Path("models/smollm2-135m-instruct"))
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 40, 64])
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    engines = {
        "plain": started_engine(args.model, tokenizer, input_major=False),
        "input_major": started_engine(args.model, tokenizer, input_major=True),
    }
    results: dict[str, object] = {}
    for rows in args.rows:
        prompt_ids = prompts(tokenizer, max(1, rows // GROUP))
        seconds: dict[str, list[float]] = {name: [] for name in engines}
        for engine in engines.values():  # warm-up
            round_seconds(engine, prompt_ids, args.tokens)
        for _ in range(args.repeats):
            for name, engine in engines.items():
                seconds[name].append(round_seconds(engine, prompt_ids, args.tokens))
        mean, low, high = bootstrap_ratio(seconds["plain"], seconds["input_major"])
        generated = len(prompt_ids) * GROUP * args.tokens
        results[f"{rows}_rows"] = {
            **{
                f"{name}_tokens_per_s": round(generated / statistics.median(times), 1)
                for name, times in seconds.items()
            },
            "speedup": [round(mean, 3), round(low, 3), round(high, 3)],
        }
    for engine in engines.values():
        engine.shutdown()
    line = {"benchmark": "input_major", "cpu": cpu_name(), "threads": 1, "model": args.model.name,
            "tokens": args.tokens, "repeats": args.repeats, "results": results}  # fmt: skip
    print(json.dumps(line))


if __name__ == "__main__":
    main()
