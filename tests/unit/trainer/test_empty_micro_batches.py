"""Micro-batches with no token to train (truncated, masked completions) never crash a step.

Regression: `completion_logprobs` returns an empty tensor without a gradient for such a
micro-batch, and the step called `.backward()` on it ("element 0 of tensors does not require
grad"). With `sample_packing: false` every sample is a micro-batch of its own, so one fully
masked sample was enough to stop training.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.train import train_step
from asyncrl.types import TrainingBatch, TrainingSample


def sample(trained: bool, advantage: float) -> TrainingSample:
    return TrainingSample(
        prompt_ids=[40, 41, 42], completion_ids=[70, 71, 72], completion_mask=[trained] * 3,
        inference_logprobs=[-4.8] * 3, advantages=[advantage] * 3, policy_versions=[0] * 3,
        temperature=1.0, env="e",
    )  # fmt: skip


def step(model_dir: Path, batch: TrainingBatch) -> tuple[torch.nn.Module, dict, object]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = TrainerConfig(model=str(model_dir), lora=False, optimizer="adamw", recipe="fp32",
                           learning_rate=1e-3, sample_packing=False)  # fmt: skip
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, 1)
    micro_batches = build_micro_batches(batch, 32, 1, 0, "token", packing=False)
    stats = train_step(model, None, optimizer, scheduler, micro_batches, config, version=0)
    return model, before, stats


def test_a_fully_masked_sample_in_its_own_micro_batch_is_skipped(tiny_model_dir: Path) -> None:
    batch = TrainingBatch(1, [sample(False, 1.0), sample(True, 1.0), sample(True, -0.5)])
    model, before, stats = step(tiny_model_dir, batch)
    assert stats.loss_tokens == 6 and stats.empty_steps == 0
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_a_batch_with_nothing_to_train_updates_nothing_and_is_counted(
    tiny_model_dir: Path,
) -> None:
    batch = TrainingBatch(1, [sample(False, 1.0), sample(False, -1.0)])
    model, before, stats = step(tiny_model_dir, batch)
    assert stats.empty_steps == 1 and stats.summary()["empty_steps"] == 1
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
