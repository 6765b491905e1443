"""The embedded engine's decode step against a bare forward pass of the same batch.

A decode step is one batched forward pass plus what the engine does around it: sampling,
logprobs, bookkeeping, and in a server, HTTP and the GIL shared with the event loop. This
measures, for `--rows` sequences decoding `--tokens` tokens each (EOS ignored, temperature 1,
groups of 8 sharing a prompt, as the orchestrator asks), on one core:

- `bare`: the model's forward pass alone on the same batch shape and cache lengths (the
  engine's own cache and mask, no sampling), per step;
- `engine_busy`: the engine's time inside its steps, per step (what `/metrics` calls
  `asyncrl:engine_busy_seconds_total` over `asyncrl:engine_steps_total`), in a real server;
- `server_wall`: the server's wall time per token of a request, from the first request sent to
  the last answer received over HTTP: everything a client waits for.

Rounds alternate between bare and server, `--repeats` times; the JSON line gives medians and
the ratios engine_busy ÷ bare and server_wall ÷ bare with their spread over rounds.

    python benchmarks/engine_step.py [--preset small] [--rows 32] [--tokens 24] [--dtype bf16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.init_model import InitModelConfig
from asyncrl.cpu_affinity import CPUS_ENV, usable_cores
from asyncrl.envs.reverse_text import ReverseTextEnv
from asyncrl.inference.kv_cache import SlotKVCache
from asyncrl.launch.inference_process import inference_server
from asyncrl.models.init_model import init_model
from machine import cpu_name

GROUP = 8
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def prompts(tokenizer: AutoTokenizer, count: int) -> list[list[int]]:
    examples = ReverseTextEnv(seed=1).examples("eval", count)
    return [
        tokenizer.apply_chat_template(e.prompt, add_generation_prompt=True)["input_ids"]
        for e in examples
    ]


def bare_step_seconds(model: torch.nn.Module, lengths: list[int], tokens: int) -> float:
    """Seconds per decode step of the forward pass alone: rows at the prompts' lengths, one
    new token each, `tokens` steps, through the engine's own cache and mask."""
    config = model.config
    cache = SlotKVCache(
        num_layers=config.num_hidden_layers, num_slots=len(lengths),
        num_kv_heads=config.num_key_value_heads, max_len=max(lengths) + tokens + 1,
        head_dim=config.hidden_size // config.num_attention_heads,
        dtype=next(model.parameters()).dtype,
    )  # fmt: skip
    slots = list(range(len(lengths)))
    inputs = torch.zeros(len(lengths), 1, dtype=torch.long)
    with torch.inference_mode():
        started = time.perf_counter()
        for step in range(tokens):
            cache.prepare(slots, [length + step for length in lengths], 1)
            model(
                input_ids=inputs, position_ids=cache.position_ids(),
                attention_mask=cache.attention_mask(), past_key_values=cache, use_cache=True,
            )  # fmt: skip
        return (time.perf_counter() - started) / tokens


async def server_round(url: str, batch: list[list[int]], tokens: int) -> dict[str, float]:
    """One round of requests (a group of GROUP per prompt): wall seconds per token, and the
    engine's busy seconds and steps over the round."""
    body = {"temperature": 1.0, "max_tokens": tokens, "ignore_eos": True, "n": GROUP}
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        before = await engine_counters(client)
        started = time.perf_counter()
        responses = await asyncio.gather(
            *(client.post("/v1/completions", json={**body, "prompt": ids}) for ids in batch)
        )
        wall = time.perf_counter() - started
        after = await engine_counters(client)
    assert all(response.status_code == 200 for response in responses)
    steps = after["steps"] - before["steps"]
    return {
        "server_wall": wall / tokens,
        "engine_busy": (after["busy"] - before["busy"]) / max(steps, 1),
        "steps": steps,
    }


async def engine_counters(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    values = {}
    for line in text.splitlines():
        if line.startswith("asyncrl:engine_busy_seconds_total"):
            values["busy"] = float(line.rsplit(" ", 1)[1])
        if line.startswith("asyncrl:engine_steps_total"):
            values["steps"] = float(line.rsplit(" ", 1)[1])
    return values


def spread(values: list[float]) -> list[float]:
    return [round(min(values), 3), round(max(values), 3)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--rows", type=int, default=32, help="sequences decoding at once")
    parser.add_argument("--tokens", type=int, default=24, help="tokens each sequence decodes")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    core = usable_cores()[-1]
    os.sched_setaffinity(0, {core})  # this process (bare forward) and the server: one core
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = init_model(InitModelConfig(preset=args.preset, output_dir=f"{tmp}/model"))
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        batch = prompts(tokenizer, args.rows // GROUP)
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=DTYPES[args.dtype], attn_implementation="sdpa"
        ).eval()
        lengths = [len(ids) for ids in batch for _ in range(GROUP)]
        dtype = {"bf16": "bfloat16", "fp32": "float32"}[args.dtype]
        env = {"OMP_NUM_THREADS": "1", CPUS_ENV: str(core)}
        rounds: list[dict[str, float]] = []
        with inference_server(
            Path(model_dir), "--dtype", dtype, "--max_num_seqs", str(args.rows),
            "--max_model_len", "512", env=env,
        ) as url:  # fmt: skip
            asyncio.run(server_round(url, batch, args.tokens))  # warm-up
            bare_step_seconds(model, lengths, args.tokens)
            for _ in range(args.repeats):
                bare = bare_step_seconds(model, lengths, args.tokens)
                rounds.append({"bare": bare, **asyncio.run(server_round(url, batch, args.tokens))})
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print(json.dumps({
        "benchmark": "engine_step", "cpu": cpu_name(), "preset": args.preset,
        "rows": args.rows, "tokens": args.tokens, "dtype": args.dtype, "threads": 1,
        "ms_per_step": {k: round(1000 * v, 2) for k, v in medians.items() if k != "steps"},
        "engine_busy_over_bare": round(medians["engine_busy"] / medians["bare"], 3),
        "engine_busy_over_bare_range": spread([r["engine_busy"] / r["bare"] for r in rounds]),
        "server_wall_over_bare": round(medians["server_wall"] / medians["bare"], 3),
        "server_wall_over_bare_range": spread([r["server_wall"] / r["bare"] for r in rounds]),
        "engine_steps_per_round": medians["steps"],
        "repeats": args.repeats,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
