"""The entropy bonus through the real trainer path: on the `tiny` model in float32, the loss's
gradient with `entropy_coef` is the same whether the LM head runs in checkpointed chunks or at
once (the entropy's gradient survives recomputation), it differs from the plain loss's by the
bonus, and a train step with the bonus raises the policy's entropy on the batch. The entropy's
gradient itself is checked against autograd in tests/unit/trainer/test_token_softmax.py."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config.trainer import LossConfig, TrainerConfig
from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.loss import LossInputs, compute_loss, loss_named
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.train import train_step
from asyncrl.types import TrainingBatch

pytestmark = [pytest.mark.integration]

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "golden_batch.json"


def micro_batches(loss: LossConfig) -> list:
    batch = msgspec.json.decode(GOLDEN.read_bytes(), type=TrainingBatch)
    return build_micro_batches(
        batch, 64, 8, 0, loss_named(loss.type).normalisation, loss_config=loss
    )


def gradients(model_dir: Path, loss: LossConfig, chunk_size: int | None) -> dict:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for mb in micro_batches(loss):
        current = completion_logprobs(
            model, mb.packed, mb.temperature, chunk_size=chunk_size,
            entropy_grad=loss.entropy_coef > 0,
        )  # fmt: skip
        inputs = LossInputs(
            logprobs=current.logprobs, inference_logprobs=mb.inference_logprobs,
            advantages=mb.advantages, sequence_ids=mb.sequence_ids,
            token_weights=mb.token_weights, entropies=current.entropy,
        )  # fmt: skip
        compute_loss(inputs, loss).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_the_bonus_gradient_is_the_same_chunked_or_whole(tiny_model_dir: Path) -> None:
    bonus = LossConfig(type="grpo_clip", entropy_coef=0.5)
    whole = gradients(tiny_model_dir, bonus, chunk_size=None)
    chunked = gradients(tiny_model_dir, bonus, chunk_size=7)  # several checkpointed chunks
    plain = gradients(tiny_model_dir, LossConfig(type="grpo_clip"), chunk_size=None)
    difference = 0.0
    for name, value in whole.items():
        assert torch.allclose(chunked[name], value, atol=1e-6, rtol=1e-5), name
        difference = max(difference, float((value - plain[name]).abs().max()))
    assert difference > 1e-4  # the bonus is there


def test_a_step_with_only_the_bonus_raises_the_entropy(tiny_model_dir: Path) -> None:
    """Advantages all 0: the policy term is silent and the update follows the entropy alone."""
    config = TrainerConfig(
        model=str(tiny_model_dir), lora=False, optimizer="adamw", recipe="fp32",
        learning_rate=1e-3, lr_scheduler_type="constant", max_grad_norm=1.0, sequence_len=64,
        per_device_train_batch_size=8, loss={"type": "grpo_clip", "entropy_coef": 1.0},
    )  # fmt: skip
    batch = msgspec.json.decode(GOLDEN.read_bytes(), type=TrainingBatch)
    silent = msgspec.structs.replace(
        batch,
        samples=[
            msgspec.structs.replace(s, advantages=[0.0] * len(s.advantages)) for s in batch.samples
        ],
    )
    built = build_micro_batches(silent, 64, 8, 0, loss_named("grpo_clip").normalisation,
                                loss_config=config.loss)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, 3)
    entropies = []
    for version in range(3):
        stats = train_step(model, None, optimizer, scheduler, built, config, version)
        entropies.append(stats.entropy_sum / stats.loss_tokens)
    assert entropies[0] < entropies[1] < entropies[2]
