"""The trainer on 1 and on 2 ranks (FSDP2, ZeRO-3, gloo on CPU), side by side in one run.

For each world size it starts `torch.distributed.run` with this file as the worker. Each rank
builds the real trainer (load_model, shard_model, AdamW), takes a warm-up step and `--steps`
timed steps of `train_step` on a fixed synthetic batch split across the ranks, and reports:
the bytes of parameters and of optimizer state it holds (its local shards, counted exactly),
its peak resident memory, and its training tokens per second. Prints one JSON line with the
2-rank ÷ 1-rank ratios (goal: parameters + optimizer state per rank ≤ 0.6×).

    python benchmarks/trainer_scaling.py [--preset base] [--steps 3]

On a 2-core CPU two ranks share the cores, so tokens/s per rank measures the split, not a
speed-up; the memory figures are what this benchmark is for.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def synthetic_batch(samples: int, prompt: int, completion: int):  # -> TrainingBatch
    from asyncrl.types import TrainingBatch, TrainingSample

    rng = random.Random(0)
    return TrainingBatch(
        step=1,
        samples=[
            TrainingSample(
                prompt_ids=[rng.randrange(4, 128) for _ in range(prompt)],
                completion_ids=[rng.randrange(4, 128) for _ in range(completion)],
                completion_mask=[True] * completion,
                inference_logprobs=[-4.8] * completion,
                advantages=[rng.choice((-1.0, 1.0))] * completion,
                policy_versions=[0] * completion,
                temperature=1.0,
                env="bench",
            )
            for _ in range(samples)
        ],
    )


def local_bytes(tensors) -> int:
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def worker(model_dir: str, steps: int, samples: int, out: Path) -> None:
    from asyncrl.config.trainer import TrainerConfig
    from asyncrl.trainer.optim import build_optimizer, build_scheduler
    from asyncrl.trainer.parallel import (
        close_ranks,
        init_ranks,
        peak_memory_bytes,
    )
    from asyncrl.trainer.train import build_policy, this_ranks_micro_batches, train_step

    ranks = init_ranks(int(os.environ.get("WORLD_SIZE", "1")), timeout=600)
    config = TrainerConfig(
        model=model_dir, lora=False, optimizer="adamw", recipe="fp32", learning_rate=1e-5,
        sequence_len=512, per_device_train_batch_size=4, world_size=ranks.world_size,
        zero_level=3, loss={"type": "grpo_clip"},
    )  # fmt: skip
    model, _ = build_policy(config, ranks)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, steps + 1)
    batch = synthetic_batch(samples, prompt=96, completion=32)
    micro_batches = this_ranks_micro_batches(batch, config, ranks, pad_token_id=0)
    elapsed = 0.0
    for step in range(steps + 1):  # step 0 warms up (allocations, optimizer state)
        started = time.perf_counter()
        train_step(model, None, optimizer, scheduler, micro_batches, config, step, ranks=ranks)
        elapsed += (time.perf_counter() - started) if step else 0.0
    states = [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    tokens = sum(mb.packed.input_ids.numel() for mb in micro_batches) * steps
    report = {
        "rank": ranks.rank,
        "parameter_bytes": local_bytes(model.parameters()),
        "optimizer_bytes": local_bytes(states),
        "peak_rss_bytes": peak_memory_bytes(ranks.device),
        "tokens_per_s": tokens / elapsed,
    }
    (out / f"rank_{ranks.rank}.json").write_text(json.dumps(report))
    close_ranks(ranks)


def run(world_size: int, model_dir: Path, steps: int, samples: int, work: Path) -> list[dict]:
    out = work / f"world_{world_size}"
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={world_size}", __file__, "--worker", "--model", str(model_dir),
               "--steps", str(steps), "--samples", str(samples), "--out", str(out)]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(world_size)]


def parser() -> argparse.ArgumentParser:
    """The command line, built without running anything (tests/unit/test_benchmarks.py)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="base")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=32, help="samples in the batch")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = parser().parse_args()
    if args.worker:
        worker(args.model, args.steps, args.samples, args.out)
        return
    from asyncrl.config.init_model import InitModelConfig
    from asyncrl.models.init_model import init_model

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = init_model(InitModelConfig(preset=args.preset, output_dir=str(work / "m")))
        one = run(1, model_dir, args.steps, args.samples, work)
        two = run(2, model_dir, args.steps, args.samples, work)

    def held(report: dict) -> int:
        return report["parameter_bytes"] + report["optimizer_bytes"]

    print(json.dumps({
        "benchmark": "trainer_scaling", "preset": args.preset, "zero_level": 3,
        "cpu": os.popen("lscpu | sed -n 's/^Model name: *//p'").read().strip(),
        "one_rank": one[0], "two_ranks": two,
        "params_and_optimizer_per_rank_ratio": round(max(held(r) for r in two) / held(one[0]), 3),
        "peak_rss_per_rank_ratio": round(
            max(r["peak_rss_bytes"] for r in two) / one[0]["peak_rss_bytes"], 3
        ),
        "tokens_per_s_per_rank": {"one": round(one[0]["tokens_per_s"]),
                                  "two": [round(r["tokens_per_s"]) for r in two]},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
