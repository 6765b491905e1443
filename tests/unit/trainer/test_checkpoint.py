"""A trainer checkpoint restores weights, optimizer, scheduler and RNG exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_model
from transformers import AutoModelForCausalLM

from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.checkpoint import (
    LEGACY_STATE,
    LEGACY_WEIGHTS,
    load_trainer_checkpoint,
    save_trainer_checkpoint,
)
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.parallel import Ranks


def setup(model_dir: Path) -> tuple:
    config = TrainerConfig(model=str(model_dir), optimizer="adamw", warmup_steps=3,
                           lr_scheduler_type="cosine")  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = build_optimizer(model, config)
    return model, optimizer, build_scheduler(optimizer, config, total_steps=10)


def train_a_step(model: torch.nn.Module, optimizer, scheduler) -> None:
    loss = model(torch.tensor([[70, 71, 72, 73]]), labels=torch.tensor([[70, 71, 72, 73]])).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


def test_round_trip_restores_everything(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, optimizer, scheduler = setup(tiny_model_dir)
    for _ in range(2):
        train_a_step(model, optimizer, scheduler)
    torch.manual_seed(123)
    save_trainer_checkpoint(tmp_path / "ckpt", 2, model, optimizer, scheduler)
    expected_noise = torch.rand(3)
    train_a_step(model, optimizer, scheduler)  # the run goes on after the save
    expected = {n: p.detach().clone() for n, p in model.named_parameters()}

    fresh, fresh_optimizer, fresh_scheduler = setup(tiny_model_dir)
    step = load_trainer_checkpoint(tmp_path / "ckpt", fresh, fresh_optimizer, fresh_scheduler)
    assert step == 2 and (tmp_path / "ckpt" / "COMPLETE").exists()
    assert torch.equal(torch.rand(3), expected_noise)  # RNG restored
    train_a_step(fresh, fresh_optimizer, fresh_scheduler)  # the same third step
    for name, parameter in fresh.named_parameters():
        assert torch.allclose(parameter, expected[name], atol=1e-7), name


def test_a_checkpoint_in_the_earlier_single_process_format_still_loads(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model, optimizer, scheduler = setup(tiny_model_dir)
    train_a_step(model, optimizer, scheduler)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    save_model(model, str(legacy / LEGACY_WEIGHTS))
    torch.save({"step": 1, "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state()},
               legacy / LEGACY_STATE)  # fmt: skip
    train_a_step(model, optimizer, scheduler)
    expected = {n: p.detach().clone() for n, p in model.named_parameters()}

    fresh, fresh_optimizer, fresh_scheduler = setup(tiny_model_dir)
    assert load_trainer_checkpoint(legacy, fresh, fresh_optimizer, fresh_scheduler) == 1
    train_a_step(fresh, fresh_optimizer, fresh_scheduler)
    for name, parameter in fresh.named_parameters():
        assert torch.allclose(parameter, expected[name], atol=1e-7), name


def test_an_old_single_process_checkpoint_on_several_ranks_says_how_to_resume_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model, optimizer, scheduler = setup(tiny_model_dir)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    save_model(model, str(legacy / LEGACY_WEIGHTS))
    # refused before any collective, so no process group is needed here
    two_ranks = Ranks(rank=0, world_size=2, device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match=r"single-process checkpoint .* trainer.world_size 1"):
        load_trainer_checkpoint(legacy, model, optimizer, scheduler, ranks=two_ranks)
