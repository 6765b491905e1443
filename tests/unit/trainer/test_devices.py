"""Every tensor the trainer makes lands on its inputs' device (review finding: the masked_is and
gspo losses built their `index_add`/`scatter_reduce` targets on the CPU, so the default loss
failed on a GPU).

There is no GPU here, so a device stand-in does the GPU's job: the default device is set to
`meta` while inputs and model stay on the CPU. A tensor created without `device=` then lands on
`meta`, where a GPU run would have put it on the CPU, and any operation mixing it with the real
inputs raises — the same mistake, caught the same way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config.trainer import LossConfig, TrainerConfig
from asyncrl.trainer.loss import NORMALISATION, LossInputs, compute_loss, sequence_weights
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.train import train_step
from asyncrl.types import TrainingBatch, TrainingSample

LENGTHS = [4, 2, 5, 3]
LOSSES = ["masked_is", "grpo_clip", "dapo", "dr_grpo", "gspo", "cispo"]
STAND_IN = torch.device("meta")  # the default device while the code under test runs


def loss_and_gradient(
    loss_type: str, default_device: torch.device | None
) -> tuple[float, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor(LENGTHS)
    total = sum(LENGTHS)
    logprobs = (-3 * torch.rand(total, generator=generator, dtype=torch.float64)).requires_grad_()
    noise = 0.2 * torch.randn(total, generator=generator, dtype=torch.float64)
    inputs = LossInputs(
        logprobs=logprobs,
        inference_logprobs=logprobs.detach() + noise,
        advantages=torch.randn(len(LENGTHS), generator=generator)
        .double()
        .repeat_interleave(lengths),
        sequence_ids=torch.arange(len(LENGTHS)).repeat_interleave(lengths),
        token_weights=sequence_weights(
            NORMALISATION[loss_type], lengths, total, len(LENGTHS), max(LENGTHS)
        ).repeat_interleave(lengths),
        ref_logprobs=logprobs.detach() - noise,
    )
    config = LossConfig(type=loss_type, beta=0.0 if loss_type == "masked_is" else 0.1)
    with default_device or torch.device("cpu"):
        output = compute_loss(inputs, config)
        output.loss.backward()
    assert logprobs.grad is not None
    return output.loss.item(), logprobs.grad


@pytest.mark.parametrize("loss_type", LOSSES)
def test_every_loss_keeps_to_its_inputs_device_on_a_stand_in(loss_type: str) -> None:
    loss, gradient = loss_and_gradient(loss_type, STAND_IN)  # raised here before the fix
    expected_loss, expected_gradient = loss_and_gradient(loss_type, None)
    assert loss == expected_loss
    assert torch.equal(gradient, expected_gradient)


def sample(advantage: float) -> TrainingSample:
    return TrainingSample(
        prompt_ids=[40, 41, 42], completion_ids=[70, 71, 72, 73], completion_mask=[True] * 4,
        inference_logprobs=[-4.8] * 4, advantages=[advantage] * 4, policy_versions=[0] * 4,
        temperature=0.7, env="e",
    )  # fmt: skip


def params_after_a_step(
    model_dir: Path, loss_type: str, default_device: torch.device | None
) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = TrainerConfig(model=str(model_dir), lora=False, optimizer="adamw", recipe="fp32",
                           learning_rate=1e-3, loss={"type": loss_type})  # fmt: skip
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, 1)
    batch = TrainingBatch(1, [sample(1.0), sample(-1.0), sample(0.5)])
    micro_batches = build_micro_batches(batch, 32, 1, 0, NORMALISATION[loss_type])
    with default_device or torch.device("cpu"):
        train_step(model, None, optimizer, scheduler, micro_batches, config, version=0)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("loss_type", ["masked_is", "gspo"])
def test_a_train_step_keeps_to_the_models_device_on_a_stand_in(
    tiny_model_dir: Path, loss_type: str
) -> None:
    on_stand_in = params_after_a_step(tiny_model_dir, loss_type, STAND_IN)
    plain = params_after_a_step(tiny_model_dir, loss_type, None)
    assert all(torch.equal(on_stand_in[name], plain[name]) for name in plain)
