"""The trainer's FLOP rate on a real model against this machine's measured matmul peak.

One thread (the trainer's share of two cores in the async layout). The batch is an RL step of
the real-model quick start: `--prompts` chain_sum prompts through the model's chat template,
`--n` completions each of 10-18 tokens (random ids: the cost does not depend on them), shared
prefixes on, as the quick start trains. Each configuration takes a warm-up step and `--steps`
timed `train_step` calls (forward, loss, backward, clipping, AdamW).

Useful FLOPs are counted from the model's shapes, matmuls only: every token through the
decoder's linear layers (2 × their parameters forward), the LM head on the tokens that carry
a loss; training costs 3× forward (gradients of inputs and of weights), LoRA 2× on the frozen
base (its weights need no gradient). Attention scores, norms, activations and the optimizer
are overhead by this count. The peak is the best of a set of fp32 matmuls on one thread, the
model's own shapes and squares, best of 10 each. Prints one JSON line.

    python benchmarks/trainer_flops.py --model models/smollm2-135m-instruct [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from asyncrl.types import TrainingBatch, TrainingSample
from machine import cpu_name
from real_model_generation import prompts


def matmul_peak(shapes: list[tuple[int, int, int]]) -> float:
    """Best GFLOP/s of `a @ b` over `shapes` ((m, k, n)), best of 10 runs each."""
    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            a @ b
        fastest = min(_timed(lambda a=a, b=b: a @ b) for _ in range(10))
        best = max(best, 2 * m * k * n / fastest / 1e9)
    return best


def _timed(work) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def quick_start_batch(prompt_ids: list[list[int]], n: int, seed: int) -> TrainingBatch:
    rng = random.Random(seed)
    samples = []
    for prompt in prompt_ids:
        for _ in range(n):
            length = rng.randint(10, 18)
            completion = [rng.randrange(100, 40000) for _ in range(length)]
            samples.append(TrainingSample(
                prompt_ids=prompt, completion_ids=completion,
                completion_mask=[True] * length, inference_logprobs=[-2.0] * length,
                advantages=[rng.choice((-1.0, 1.0))] * length, policy_versions=[0] * length,
                temperature=0.7, env="bench",
            ))  # fmt: skip
    return TrainingBatch(step=1, samples=samples)


def useful_flops(model: torch.nn.Module, batch: TrainingBatch, lora: bool) -> float:
    """Matmul FLOPs of one training step, counted from the shapes (see the module docstring)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings().weight.numel()
    body = sum(
        module.weight.numel()
        for name, module in base.named_modules()
        if isinstance(module, torch.nn.Linear) and ".layers." in name and "lora_" not in name
    )
    prompts_once = {tuple(s.prompt_ids) for s in batch.samples}  # shared prefixes
    tokens = sum(len(p) for p in prompts_once) + sum(len(s.completion_ids) for s in batch.samples)
    loss_tokens = sum(len(s.completion_ids) for s in batch.samples)
    passes = 2 if lora else 3
    return passes * 2 * (body * tokens + head * loss_tokens)


def measure(model_dir: Path, lora: bool, batch: TrainingBatch, steps: int) -> dict[str, float]:
    from asyncrl.config.trainer import TrainerConfig
    from asyncrl.trainer.optim import build_optimizer, build_scheduler
    from asyncrl.trainer.parallel import SINGLE_PROCESS
    from asyncrl.trainer.train import build_policy, this_ranks_micro_batches, train_step

    config = TrainerConfig(
        model=str(model_dir), lora=lora, optimizer="adamw", recipe="fp32", learning_rate=1e-6,
        sequence_len=256, per_device_train_batch_size=8, shared_prefix=True,
        loss={"type": "grpo_clip"},
    )  # fmt: skip
    model, reference = build_policy(config, SINGLE_PROCESS)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, steps + 1)
    micro = this_ranks_micro_batches(batch, config, SINGLE_PROCESS, 0)
    train_step(model, reference, optimizer, scheduler, micro, config, 0)  # warm-up
    seconds = [
        _timed(lambda: train_step(model, reference, optimizer, scheduler, micro, config, 0))
        for _ in range(steps)
    ]
    flops = useful_flops(model, batch, lora)
    rates = sorted(flops / s / 1e9 for s in seconds)
    return {"step_s_median": round(statistics.median(seconds), 3),
            "gflop_per_step": round(flops / 1e9, 1),
            "gflop_s_median": round(statistics.median(rates), 1),
            "gflop_s_min": round(rates[0], 1), "gflop_s_max": round(rates[-1], 1)}  # fmt: skip


def parser() -> argparse.ArgumentParser:
    """The command line, built without running anything (tests/unit/test_benchmarks.py)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=Path("models/smollm2-135m-instruct"))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=["full", "lora"])
    return parser


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(1)
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(args.model)
    hidden, inner = config.hidden_size, config.intermediate_size
    peak = matmul_peak([(1024, 1024, 1024), (768, hidden, inner), (768, inner, hidden),
                        (768, hidden, hidden), (2048, 2048, 2048)])  # fmt: skip
    batch = quick_start_batch(prompts(AutoTokenizer.from_pretrained(args.model), args.prompts),
                              args.n, seed=0)  # fmt: skip
    results = {}
    for mode in args.modes:
        row = measure(args.model, mode == "lora", batch, args.steps)
        row["of_peak_median"] = round(row["gflop_s_median"] / peak, 3)
        results[mode] = row
    line = {"benchmark": "trainer_flops", "cpu": cpu_name(), "threads": 1,
            "matmul_peak_gflop_s": round(peak, 1), "results": results}  # fmt: skip
    print(json.dumps(line))


if __name__ == "__main__":
    main()
