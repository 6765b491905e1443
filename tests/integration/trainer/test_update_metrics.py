"""What a step reports about its own updates: with several updates per batch the clip against
the proximal policy acts on the later ones and `trainer/clip_fraction` says how often, and
`trainer/update_kl` says how far the earlier updates moved the policy (k3 of KL(π_before ‖ π)
on the batch's tokens, by hand here); with one update both are 0, as nothing moved yet."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.loss import loss_named
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.train import train_step
from asyncrl.types import TrainingBatch

pytestmark = [pytest.mark.integration]

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "golden_batch.json"


def step(model_dir: Path, iterations: int) -> tuple[dict[str, float], float]:
    config = TrainerConfig(
        model=str(model_dir), lora=False, optimizer="adamw", recipe="fp32",
        learning_rate=3e-3, lr_scheduler_type="constant", max_grad_norm=1.0, sequence_len=64,
        per_device_train_batch_size=8, num_iterations=iterations, loss={"type": "grpo_clip"},
    )  # fmt: skip
    batch = msgspec.json.decode(GOLDEN.read_bytes(), type=TrainingBatch)
    built = build_micro_batches(batch, 64, 8, 0, loss_named("grpo_clip").normalisation,
                                loss_config=config.loss)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, iterations)
    with torch.no_grad():
        before = [completion_logprobs(model, mb.packed, mb.temperature).logprobs for mb in built]
    if iterations == 2:  # the weights after the first update, as the second update sees them
        probe = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        probe_optimizer = build_optimizer(probe, config)
        one = config.model_copy(update={"num_iterations": 1})
        train_step(probe, None, probe_optimizer, build_scheduler(probe_optimizer, one, 1),
                   built, one, 0)  # fmt: skip
        with torch.no_grad():
            after = [completion_logprobs(probe, mb.packed, mb.temperature).logprobs
                     for mb in built]  # fmt: skip
        log_ratio = torch.cat(after) - torch.cat(before)
        by_hand = float((torch.exp(log_ratio) - 1 - log_ratio).mean())
    else:
        by_hand = 0.0
    stats = train_step(model, None, optimizer, scheduler, built, config, 0)
    return stats.summary(), by_hand


def test_one_update_moves_nothing_before_it_and_clips_nothing(tiny_model_dir: Path) -> None:
    summary, _ = step(tiny_model_dir, 1)
    assert summary["update_kl"] == 0.0
    assert summary["clip_fraction"] == 0.0  # ρ = 1 against the proximal policy


def test_a_second_update_reports_how_far_the_first_moved_and_what_it_clipped(
    tiny_model_dir: Path,
) -> None:
    summary, by_hand = step(tiny_model_dir, 2)
    assert summary["update_kl"] > 0.0
    assert summary["update_kl"] == pytest.approx(by_hand, rel=1e-4)
    assert 0.0 < summary["clip_fraction"] < 1.0
