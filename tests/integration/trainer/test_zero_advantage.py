"""Samples whose advantages are all 0 are not computed, and the update is the one the whole
batch gives: against a reference step that runs every sample (`build_micro_batches` with no
selection), on the `tiny` model in float32, for every built-in loss without a KL term; a batch
with no signal at all still steps AdamW as before; a KL term or a loss of the user's own
computes everything."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config.trainer import LossConfig, TrainerConfig
from asyncrl.trainer.loss import loss_named
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.parallel import SINGLE_PROCESS
from asyncrl.trainer.train import this_ranks_micro_batches, train_step
from asyncrl.trainer.zero_advantage import samples_to_compute
from asyncrl.types import TrainingBatch

pytestmark = [pytest.mark.integration]

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "golden_batch.json"


def batch_with_silent_groups(silent: set[int]) -> TrainingBatch:
    """The golden batch (8 samples, all with signal) with the samples `silent` names given
    advantage 0 on every token, as a group that scored alike would have."""
    batch = msgspec.json.decode(GOLDEN.read_bytes(), type=TrainingBatch)
    samples = [
        msgspec.structs.replace(s, advantages=[0.0] * len(s.advantages)) if i in silent else s
        for i, s in enumerate(batch.samples)
    ]
    return msgspec.structs.replace(batch, samples=samples)


def config_for(model_dir: Path, loss_type: str) -> TrainerConfig:
    return TrainerConfig(
        model=str(model_dir), lora=False, optimizer="adamw", recipe="fp32", learning_rate=1e-3,
        lr_scheduler_type="constant", max_grad_norm=1.0, sequence_len=64,
        per_device_train_batch_size=2, loss={"type": loss_type},
    )  # fmt: skip


def every_sample(batch: TrainingBatch, config: TrainerConfig) -> list:
    """The reference: micro-batches of the whole batch, nothing left out."""
    return build_micro_batches(
        batch, config.sequence_len, config.per_device_train_batch_size, 0,
        loss_named(config.loss.type).normalisation, loss_config=config.loss,
    )  # fmt: skip


def weights_after(
    model_dir: Path, config: TrainerConfig, steps: list[list]
) -> tuple[dict, list[tuple[float, float]]]:
    """Parameters after one train_step per entry of `steps` (each a list of micro-batches), and
    each step's (loss, gradient norm): AdamW's first update is nearly the gradient's sign, so
    the norm is what shows a step of the wrong size."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, len(steps))
    measured = []
    for version, micro_batches in enumerate(steps):
        stats = train_step(model, None, optimizer, scheduler, micro_batches, config, version)
        measured.append((stats.loss, stats.grad_norm))
    return {name: p.detach().clone() for name, p in model.named_parameters()}, measured


def assert_same(first: dict, second: dict) -> None:
    moved = 0.0
    for name, value in first.items():
        assert torch.allclose(value, second[name], atol=2e-6, rtol=0), name
        moved = max(moved, float((value - second[name]).abs().max()))
    assert moved < 2e-6


@pytest.mark.parametrize("loss_type", ["grpo_clip", "dr_grpo", "dapo", "gspo", "cispo",
                                       "masked_is"])  # fmt: skip
def test_the_update_is_the_whole_batchs_with_silent_samples_left_out(
    tiny_model_dir: Path, loss_type: str
) -> None:
    batch = batch_with_silent_groups({0, 1, 2, 5})
    config = config_for(tiny_model_dir, loss_type)
    assert samples_to_compute(batch, config.loss) == [3, 4, 6, 7]
    skipping = this_ranks_micro_batches(batch, config, SINGLE_PROCESS, pad_token_id=0)
    reference = every_sample(batch, config)
    assert sum(mb.num_loss_tokens for mb in skipping) < sum(mb.num_loss_tokens for mb in reference)
    start, _ = weights_after(tiny_model_dir, config, [])
    skipped, [(loss, norm)] = weights_after(tiny_model_dir, config, [skipping])
    whole, [(whole_loss, whole_norm)] = weights_after(tiny_model_dir, config, [reference])
    assert norm > 0 and norm == pytest.approx(whole_norm, rel=1e-5)
    assert loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-7)
    assert_same(skipped, whole)
    assert any(not torch.equal(skipped[name], start[name]) for name in start)  # it did learn


def test_a_batch_without_signal_steps_the_optimizer_as_before(tiny_model_dir: Path) -> None:
    """After a step with signal, a step whose every advantage is 0: AdamW's momentum moves the
    weights on either way; leaving the silent samples out must not skip that."""
    config = config_for(tiny_model_dir, "grpo_clip")
    signal = batch_with_silent_groups(set())
    silent = batch_with_silent_groups(set(range(8)))
    chosen = samples_to_compute(silent, config.loss)
    assert len(chosen) == 1  # one sample computed, for a gradient of 0 that is there
    first = this_ranks_micro_batches(signal, config, SINGLE_PROCESS, pad_token_id=0)
    skipped, _ = weights_after(tiny_model_dir, config, [first, this_ranks_micro_batches(
        silent, config, SINGLE_PROCESS, pad_token_id=0)])  # fmt: skip
    whole, _ = weights_after(tiny_model_dir, config, [first, every_sample(silent, config)])
    after_first, _ = weights_after(tiny_model_dir, config, [first])
    assert_same(skipped, whole)
    assert any(not torch.equal(skipped[n], after_first[n]) for n in after_first)


def test_a_kl_term_an_entropy_term_or_a_users_loss_computes_every_sample() -> None:
    batch = batch_with_silent_groups({0, 1})
    everything = list(range(8))
    assert samples_to_compute(batch, LossConfig(type="grpo_clip", beta=0.1)) == everything
    # a tied group's tokens have an entropy gradient: the bonus must reach them too
    assert samples_to_compute(batch, LossConfig(type="grpo_clip", entropy_coef=0.01)) == everything
    assert samples_to_compute(batch, LossConfig(type="masked_is", kl_tau=0.1)) == everything
    custom = LossConfig.model_construct(type="tests.unit.trainer.reinforce_loss:reinforce")
    assert samples_to_compute(batch, custom) == everything  # says nothing: all computed
    # a user's LossSpec that says it may be skipped, described by a short-lived process
    declared = LossConfig.model_construct(type="tests.unit.trainer.reinforce_loss:SILENT_SPEC")
    assert samples_to_compute(batch, declared) == everything[2:]
    assert samples_to_compute(batch, LossConfig(type="dapo")) == everything[2:]
