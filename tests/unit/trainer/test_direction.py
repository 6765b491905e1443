"""One GRPO step moves the policy the right way: up on positive advantage, down on negative."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.train import train_step
from asyncrl.types import TrainingBatch, TrainingSample


def sample(completion: list[int], advantage: float, logprobs: list[float]) -> TrainingSample:
    n = len(completion)
    return TrainingSample(
        prompt_ids=[40, 41, 42], completion_ids=completion, completion_mask=[True] * n,
        inference_logprobs=logprobs, advantages=[advantage] * n, policy_versions=[0] * n,
        temperature=1.0, env="e",
    )  # fmt: skip


@pytest.mark.parametrize(
    "loss_type", ["masked_is", "grpo_clip", "dapo", "dr_grpo", "gspo", "cispo"]
)
def test_a_step_raises_good_completions_and_lowers_bad_ones(
    loss_type: str, tiny_model_dir: Path
) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    good, bad = [70, 71, 72, 73], [80, 81, 82, 83]
    probe = TrainingBatch(1, [sample(good, 1.0, [0.0] * 4), sample(bad, -1.0, [0.0] * 4)])

    def sequence_logprobs() -> list[float]:
        mb = build_micro_batches(probe, 32, 4, 0, "token")[0]
        with torch.no_grad():
            values = completion_logprobs(model, mb.packed, mb.temperature).logprobs
        return [float(values[mb.sequence_ids == i].sum()) for i in range(2)]

    before = sequence_logprobs()
    # the batch as the server would have sent it: inference logprobs = the current policy's
    mb = build_micro_batches(probe, 32, 4, 0, "token")[0]
    with torch.no_grad():
        current = completion_logprobs(model, mb.packed, mb.temperature).logprobs.tolist()
    batch = TrainingBatch(1, [sample(good, 1.0, current[:4]), sample(bad, -1.0, current[4:])])
    config = TrainerConfig(
        model=str(tiny_model_dir), lora=False, optimizer="adamw", recipe="fp32",
        learning_rate=1e-3, loss={"type": loss_type, "epsilon": 0.2},
    )  # fmt: skip
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, 1)
    from asyncrl.trainer.loss import NORMALISATION

    micro_batches = build_micro_batches(batch, 32, 4, 0, NORMALISATION[loss_type])
    train_step(model, None, optimizer, scheduler, micro_batches, config, version=0)
    after = sequence_logprobs()
    assert after[0] > before[0] + 0.01  # the good completion became likelier
    assert after[1] < before[1] - 0.01  # the bad one less likely


def test_later_updates_of_a_batch_clip_against_the_policy_it_started_from(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `num_iterations: 2` the second update's proximal logprobs are the first update's
    (the weights the batch started from), not the moved weights' own."""
    import asyncrl.trainer.train as train_module

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch = TrainingBatch(1, [sample([70, 71, 72], 1.0, [-4.0] * 3),
                              sample([80, 81, 82], -1.0, [-4.0] * 3)])  # fmt: skip
    config = TrainerConfig(
        model=str(tiny_model_dir), lora=False, optimizer="adamw", recipe="fp32",
        learning_rate=1e-2, num_iterations=2, loss={"type": "grpo_clip"},
    )  # fmt: skip
    seen: list[tuple[torch.Tensor | None, torch.Tensor]] = []
    real = train_module.compute_loss

    def recording(inputs, loss_config):  # type: ignore[no-untyped-def]
        seen.append((inputs.proximal_logprobs, inputs.logprobs.detach().clone()))
        return real(inputs, loss_config)

    monkeypatch.setattr(train_module, "compute_loss", recording)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, 2)
    micro_batches = build_micro_batches(batch, 32, 4, 0, "sequence")
    train_step(model, None, optimizer, scheduler, micro_batches, config, version=0)
    (first_proximal, first), (second_proximal, second) = seen
    assert first_proximal is None  # the first update: the current logprobs themselves
    assert second_proximal is not None and torch.equal(second_proximal, first)
    assert not torch.allclose(second, first)  # the weights did move in between
