"""A trainer checkpoint restores weights, optimizer, scheduler and RNG exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
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


def test_a_qlora_checkpoint_holds_the_adapters_and_restores_the_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The 4-bit base is not saved (loading the model gives it again, and its quantization
    state does not load back in place); adapters, optimizer and schedule are, exactly."""
    pytest.importorskip("bitsandbytes")
    from asyncrl.trainer.model import load_model

    config = TrainerConfig(model=str(tiny_model_dir), qlora_bnb=True, lora_rank=4,
                           optimizer="adamw", recipe="fp32", learning_rate=1e-2)  # fmt: skip

    def build() -> tuple:
        torch.manual_seed(0)
        model = load_model(config).train()
        optimizer = build_optimizer(model, config)
        return model, optimizer, build_scheduler(optimizer, config, total_steps=10)

    def step(model: torch.nn.Module, optimizer, scheduler) -> None:
        ids = torch.tensor([[70, 71, 72, 73, 74]])
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()

    model, optimizer, scheduler = build()
    for _ in range(2):
        step(model, optimizer, scheduler)
    save_trainer_checkpoint(tmp_path / "ckpt", 2, model, optimizer, scheduler)
    step(model, optimizer, scheduler)
    expected = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    saved = dcp.FileSystemReader(str(tmp_path / "ckpt" / "shards"))
    keys = [key for key in saved.read_metadata().state_dict_metadata if key.startswith("model.")]
    assert keys and all(".lora_" in key for key in keys)  # no base weight, no 4-bit state

    fresh, fresh_optimizer, fresh_scheduler = build()
    with torch.no_grad():  # a fresh run's adapters differ until the checkpoint is loaded
        for parameter in fresh.parameters():
            if parameter.requires_grad:
                parameter.add_(1.0)
    assert load_trainer_checkpoint(tmp_path / "ckpt", fresh, fresh_optimizer, fresh_scheduler) == 2
    step(fresh, fresh_optimizer, fresh_scheduler)
    trained = {n: p for n, p in fresh.named_parameters() if p.requires_grad}
    assert trained.keys() == expected.keys()
    for name, parameter in trained.items():
        torch.testing.assert_close(parameter, expected[name], atol=1e-7, rtol=0, msg=name)
