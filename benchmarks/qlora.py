"""QLoRA (`qlora_bnb`, an NF4 base) against plain LoRA on this CPU: memory, step time, mismatch.

- memory: for each preset, the frozen base as the trainer holds it with `qlora_bnb` (NF4 codes,
  absmaxes, the nested absmaxes and code tables of double quantization, and the layers left
  dense: embeddings, norms, head) against the same base in float32;
- step time: the real `train_step` on the `small` preset, QLoRA and plain LoRA alternated in
  one run so machine noise hits both alike, for the recipes given (quick-start batch shape:
  4 prompts × 8 completions, prompts of 34 tokens, completions of 8–24); the median and the
  best of the repeats (the best is the figure to trust on a machine others load);
- mismatch: short `asyncrl rl` runs (on-policy, `max_async_level: 0`) with plain
  LoRA, QLoRA serving the servers' own float32 base, and QLoRA serving its dequantized base;
  the mean of `trainer/mismatch_kl` over the steps of each.

Prints one JSON line:

    python benchmarks/qlora.py [--repeats 5] [--recipes fp32 bf16] \\
        [--parts memory step_time mismatch]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from asyncrl.config.init_model import InitModelConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.launch.inference_process import free_port
from asyncrl.models.init_model import PRESETS, init_model
from asyncrl.monitor.metrics import read_metrics
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.trainer.model import load_model
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.quantized_base import base_bytes, dense_base_bytes
from asyncrl.trainer.train import train_step
from asyncrl.types import TrainingBatch, TrainingSample
from machine import cpu_name  # benchmarks/machine.py, beside this file

MISMATCH_STEPS = 6
PARTS = ("memory", "step_time", "mismatch")


def trainer_config(model: Path, qlora: bool, recipe: str = "fp32") -> TrainerConfig:
    return TrainerConfig(model=str(model), lora=True, qlora_bnb=qlora, optimizer="adamw",
                         recipe=recipe, learning_rate=1e-6, loss={"type": "grpo_clip"})  # fmt: skip


def memory(models: dict[str, Path]) -> dict[str, dict[str, float]]:
    results = {}
    for preset, path in models.items():
        quantized = load_model(trainer_config(path, qlora=True))
        dense = load_model(trainer_config(path, qlora=False))
        dense_bytes = sum(p.numel() * p.element_size() for p in dense.parameters()
                          if not p.requires_grad)  # fmt: skip
        assert dense_bytes == dense_base_bytes(quantized)  # the two counts agree
        nf4_bytes = base_bytes(quantized)
        results[preset] = {
            "base_parameters": sum(p.numel() for p in dense.parameters() if not p.requires_grad),
            "float32_mb": round(dense_bytes / 1e6, 2), "nf4_mb": round(nf4_bytes / 1e6, 2),
            "ratio": round(dense_bytes / nf4_bytes, 2),
        }  # fmt: skip
    return results


def quick_start_batch(vocab: int, rng: random.Random) -> TrainingBatch:
    samples = []
    for _ in range(4):
        prompt = [rng.randrange(4, vocab) for _ in range(34)]
        for _ in range(8):
            n = rng.randint(8, 24)
            samples.append(TrainingSample(
                prompt_ids=prompt, completion_ids=[rng.randrange(4, vocab) for _ in range(n)],
                completion_mask=[True] * n, inference_logprobs=[-4.8] * n,
                advantages=[rng.choice([-1.0, 1.0])] * n, policy_versions=[0] * n,
                temperature=1.0, env="bench",
            ))  # fmt: skip
    return TrainingBatch(step=1, samples=samples, max_tokens=24)


def step_times(path: Path, recipes: list[str], repeats: int) -> dict[str, dict[str, float]]:
    batch = quick_start_batch(128, random.Random(0))
    variants = {}
    for recipe in recipes:
        for qlora in (False, True):
            config = trainer_config(path, qlora, recipe)
            torch.manual_seed(0)
            model = load_model(config).train()
            optimizer = build_optimizer(model, config)
            scheduler = build_scheduler(optimizer, config, 10_000)
            micro_batches = build_micro_batches(batch, 256, 8, 0, "token")
            variants[(recipe, qlora)] = (model, optimizer, scheduler, micro_batches, config)
    times: dict[tuple[str, bool], list[float]] = {key: [] for key in variants}
    for repeat in range(repeats + 1):  # the first round warms up
        order = list(variants) if repeat % 2 else list(reversed(variants))
        for key in order:
            model, optimizer, scheduler, micro_batches, config = variants[key]
            started = time.perf_counter()
            train_step(model, None, optimizer, scheduler, micro_batches, config, version=0)
            if repeat:
                times[key].append(time.perf_counter() - started)
    results = {}
    for recipe in recipes:
        lora, qlora = (statistics.median(times[(recipe, q)]) for q in (False, True))
        lora_best, qlora_best = (min(times[(recipe, q)]) for q in (False, True))
        results[recipe] = {
            "lora_step_s": round(lora, 3), "qlora_step_s": round(qlora, 3),
            "qlora_over_lora": round(qlora / lora, 2),
            "lora_best_s": round(lora_best, 3), "qlora_best_s": round(qlora_best, 3),
            "qlora_over_lora_best": round(qlora_best / lora_best, 2),
            "lora_all_s": [round(t, 3) for t in times[(recipe, False)]],
            "qlora_all_s": [round(t, 3) for t in times[(recipe, True)]],
        }  # fmt: skip
    return results


def mismatch(path: Path, root: Path) -> dict[str, float]:
    """Mean trainer/mismatch_kl of a short on-policy run per variant."""
    variants = {
        "lora": {},
        "qlora_original_base": {"qlora_bnb": True},
        "qlora_dequantized_base": {"qlora_bnb": True, "qlora_served_base": "dequantized"},
    }
    results = {}
    for name, trainer in variants.items():
        output = root / name
        config = {
            "model": str(path), "output_dir": str(output), "seq_len": 128,
            "max_steps": MISMATCH_STEPS, "max_async_level": 0, "deployment": "disaggregated",
            "inference": {"port": free_port(), "max_num_seqs": 64, "dtype": "float32"},
            "orchestrator": {"env": [{"id": "reverse-text"}], "batch_size": 32,
                             "rollouts_per_example": 8, "sampling": {"max_tokens": 16}},
            "trainer": {"lora": True, "optimizer": "adamw", "recipe": "fp32",
                        "learning_rate": 1e-4, **trainer},
        }  # fmt: skip
        file = root / f"{name}.yaml"
        file.write_text(yaml.safe_dump(config))
        subprocess.run([sys.executable, "-m", "asyncrl.cli", "rl", str(file)], check=True,
                       capture_output=True, timeout=1800)  # fmt: skip
        records = read_metrics(output / "run_default" / "metrics.jsonl")
        kls = [r["trainer/mismatch_kl"] for r in records if r["role"] == "trainer"]
        results[name] = float(f"{statistics.fmean(kls):.3g}")
    return results


def parser() -> argparse.ArgumentParser:
    """The command line, built without running anything (tests/unit/test_benchmarks.py)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--recipes", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    parser.add_argument(
        "--parts", nargs="+", default=list(PARTS), choices=PARTS, help="What to measure."
    )
    return parser


def main() -> None:
    args = parser().parse_args()
    with tempfile.TemporaryDirectory(prefix="asyncrl-qlora-") as temp:
        root = Path(temp)
        models = {
            preset: init_model(
                InitModelConfig(
                    preset=preset, tie_word_embeddings=False, output_dir=str(root / preset)
                )
            )
            for preset in PRESETS
        }
        report: dict[str, object] = {
            "benchmark": "qlora", "cpu": cpu_name(), "cores": os.cpu_count(),
            "threads": torch.get_num_threads(), "repeats": args.repeats,
        }  # fmt: skip
        if "memory" in args.parts:
            report["memory"] = memory(models)
        if "step_time" in args.parts:
            report["step_time_small"] = step_times(models["small"], args.recipes, args.repeats)
        if "mismatch" in args.parts:
            report[f"mismatch_kl_small_{MISMATCH_STEPS}_steps"] = mismatch(models["small"], root)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
