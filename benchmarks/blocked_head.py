"""The embedded engine's LM head in column blocks against the head as one product, in a whole
decode pass of a real model, side by side in one process.

Two copies of the model (fp32, one thread, pinned by the caller if wanted), one with
`use_blocked_head`; a decode-shaped pass (`rows` one-token rows, no cache: the layers' matmuls
and the head at the engine's row counts) timed alternately on each, `--repeats` times; the
ratio of medians with a bootstrap interval over the paired repeats, and the largest difference
between the two passes' logits. Prints one JSON line.

    taskset -c 1 python benchmarks/blocked_head.py \
        --model models/smollm2-135m-instruct [--model models/gemma3-270m] [--rows 32 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from asyncrl.inference.blocked_head import use_blocked_head
from machine import cpu_name
from race_stats import bootstrap_ratio


@torch.inference_mode()
def pass_seconds(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, torch.Tensor]:
    started = time.perf_counter()
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits
    return time.perf_counter() - started, logits


def compare(path: Path, rows: list[int], repeats: int) -> dict[str, object]:
    whole = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    blocked = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert use_blocked_head(blocked)
    results: dict[str, object] = {}
    for count in rows:
        ids = torch.randint(0, 1000, (count, 1), generator=torch.Generator().manual_seed(count))
        for _ in range(3):  # warm-up
            pass_seconds(whole, ids), pass_seconds(blocked, ids)
        times_whole, times_blocked, largest = [], [], 0.0
        for _ in range(repeats):
            seconds, reference = pass_seconds(whole, ids)
            times_whole.append(seconds)
            seconds, logits = pass_seconds(blocked, ids)
            times_blocked.append(seconds)
            largest = max(largest, (logits - reference).abs().max().item())
        mean, low, high = bootstrap_ratio(times_whole, times_blocked)
        results[f"{count}_rows"] = {
            "whole_ms": round(statistics.median(times_whole) * 1e3, 1),
            "blocked_ms": round(statistics.median(times_blocked) * 1e3, 1),
            "speedup": [round(mean, 3), round(low, 3), round(high, 3)],
            "max_abs_logit_difference": largest,
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, action="append")
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    models = args.model or [Path("models/smollm2-135m-instruct")]
    results = {path.name: compare(path, args.rows, args.repeats) for path in models}
    line = {"benchmark": "blocked_head", "cpu": cpu_name(), "threads": 1, "results": results}
    print(json.dumps(line))


if __name__ == "__main__":
    main()
