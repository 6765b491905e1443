"""Trainer step time with and without shared-prefix packing, side by side in one run.

Builds the `small` preset (the quick start's model shape) and times the real `train_step` on
two batch shapes, alternating the two layouts so that machine noise hits both alike:

- quick start: 4 prompts × 8 completions, prompts of 34 tokens, completions of 8–24 (as the
  reverse-text batches are), seq_len 256, 8 rows per micro-batch;
- long prompt: 2 prompts × 8 completions, prompts of 512 tokens, completions of 64,
  seq_len 1024.

For each it reports the median step time of each layout and their ratio, the tokens the model
ran over, and the achieved FLOP/s (6 × parameters × tokens, attention left out) against this
machine's measured float32 matmul peak; and the embedded engine's generated tokens per second
for the same groups (n completions per request, all submitted at once), with each request's
prompt prefilled once or n times. Prints one JSON line:

    python benchmarks/shared_prefix.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.init_model import InitModelConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.inference.engine import Engine
from asyncrl.inference.sampling import SamplingParams
from asyncrl.models.init_model import init_model
from asyncrl.trainer.micro_batches import MicroBatch, build_micro_batches
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.train import train_step
from asyncrl.types import TrainingBatch, TrainingSample
from machine import cpu_name  # benchmarks/machine.py, beside this file

SHAPES = {  # prompts, group size, prompt tokens, completion tokens (low, high), seq_len
    "quick_start": (4, 8, 34, (8, 24), 256),
    "long_prompt": (2, 8, 512, (64, 64), 1024),
}
ROWS_PER_MICRO_BATCH = 8


def synthetic_batch(shape: str, vocab: int, rng: random.Random) -> TrainingBatch:
    prompts, group, prompt_tokens, (low, high), _ = SHAPES[shape]
    samples = []
    for _ in range(prompts):
        prompt = [rng.randrange(4, vocab) for _ in range(prompt_tokens)]
        for _ in range(group):
            n = rng.randint(low, high)
            samples.append(TrainingSample(
                prompt_ids=prompt, completion_ids=[rng.randrange(4, vocab) for _ in range(n)],
                completion_mask=[True] * n, inference_logprobs=[-2.0] * n,
                advantages=[rng.choice([-1.0, 1.0])] * n, policy_versions=[0] * n,
                temperature=1.0, env="bench",
            ))  # fmt: skip
    return TrainingBatch(step=1, samples=samples, max_tokens=high)


def matmul_peak(size: int = 1024, repeats: int = 10) -> float:
    """float32 FLOP/s of a square matmul, the best of `repeats`."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def engine_tokens_per_second(
    model: torch.nn.Module, tokenizer: object, shape: str, share: bool, rng: random.Random
) -> float:
    """Generated tokens per second for the shape's groups, submitted at once (n per request)."""
    prompts, group, prompt_tokens, (_, high), seq_len = SHAPES[shape]
    engine = Engine(model, tokenizer, max_num_seqs=prompts * group, max_model_len=seq_len,
                    share_prompts=share)  # fmt: skip
    try:
        params = SamplingParams(max_tokens=high, temperature=1.0, seed=0, ignore_eos=True)
        vocab = model.config.vocab_size
        batch = [[rng.randrange(4, vocab) for _ in range(prompt_tokens)] for _ in range(prompts)]
        started = time.perf_counter()
        requests = [engine.submit(prompt, params, n=group) for prompt in batch]
        outputs = [c for r in requests for c in r.done.result(timeout=3600)]
        return sum(len(c.token_ids) for c in outputs) / (time.perf_counter() - started)
    finally:
        engine.shutdown()


def laid_out_tokens(micro_batches: list[MicroBatch]) -> int:
    return sum(int((mb.packed.sample_index >= 0).sum()) for mb in micro_batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="asyncrl-shared-prefix-") as temp:
        path = init_model(InitModelConfig(preset="small", output_dir=str(Path(temp) / "m")))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                     attn_implementation="sdpa")  # fmt: skip
        tokenizer = AutoTokenizer.from_pretrained(path)
    model.train()
    config = TrainerConfig(model=str(path), lora=False, optimizer="adamw", recipe="fp32",
                           learning_rate=1e-6, loss={"type": "grpo_clip"})  # fmt: skip
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, 10_000)
    parameters = sum(p.numel() for p in model.parameters())
    peak = matmul_peak()
    rng = random.Random(0)
    results: dict[str, dict[str, float]] = {}
    for shape in SHAPES:
        batch = synthetic_batch(shape, model.config.vocab_size, rng)
        seq_len = SHAPES[shape][4]
        layouts = {
            shared: build_micro_batches(
                batch, seq_len, ROWS_PER_MICRO_BATCH, 0, "token", shared_prefix=shared
            )
            for shared in (False, True)
        }
        times: dict[bool, list[float]] = {False: [], True: []}
        for repeat in range(args.repeats + 1):  # the first round warms up
            for shared in (False, True) if repeat % 2 else (True, False):
                started = time.perf_counter()
                train_step(model, None, optimizer, scheduler, layouts[shared], config, version=0)
                if repeat:
                    times[shared].append(time.perf_counter() - started)
        plain, shared = statistics.median(times[False]), statistics.median(times[True])
        model.eval()
        generation: dict[bool, list[float]] = {False: [], True: []}
        for repeat in range(args.repeats):
            for share in (False, True) if repeat % 2 else (True, False):
                generation[share].append(
                    engine_tokens_per_second(model, tokenizer, shape, share, random.Random(repeat))
                )
        model.train()
        engine_plain, engine_shared = (statistics.median(generation[k]) for k in (False, True))
        tokens = {key: laid_out_tokens(value) for key, value in layouts.items()}
        results[shape] = {
            "step_s_unshared": round(plain, 3), "step_s_shared": round(shared, 3),
            "speedup": round(plain / shared, 2),
            "tokens_unshared": tokens[False], "tokens_shared": tokens[True],
            "gflops_unshared": round(6 * parameters * tokens[False] / plain / 1e9, 2),
            "gflops_shared": round(6 * parameters * tokens[True] / shared / 1e9, 2),
            "engine_tokens_per_s_unshared": round(engine_plain, 1),
            "engine_tokens_per_s_shared": round(engine_shared, 1),
            "engine_speedup": round(engine_shared / engine_plain, 2),
        }  # fmt: skip
    print(json.dumps({
        "benchmark": "shared_prefix", "cpu": cpu_name(), "cores": os.cpu_count(),
        "threads": torch.get_num_threads(), "model": "small", "parameters": parameters,
        "matmul_peak_gflops": round(peak / 1e9, 1), "repeats": args.repeats, **results,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
