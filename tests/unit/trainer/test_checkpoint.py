"""A trainer checkpoint restores weights, optimizer, scheduler and RNG exactly, and holds nothing
that runs code when it is loaded: a resume refuses the pickled checkpoints of earlier versions
(planted code in them never runs), and `asyncrl migrate-checkpoint` converts trusted ones."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_model
from torch.distributed.checkpoint.state_dict import get_state_dict
from transformers import AutoModelForCausalLM

from asyncrl.checkpoint.layout import mark_complete
from asyncrl.cli import main as asyncrl_main
from asyncrl.config.base import ConfigError
from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.checkpoint import load_trainer_checkpoint, save_trainer_checkpoint
from asyncrl.trainer.optim import build_optimizer, build_scheduler


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


def test_a_checkpoint_holds_json_and_raw_bytes_only(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, optimizer, scheduler = setup(tiny_model_dir)
    train_a_step(model, optimizer, scheduler)
    save_trainer_checkpoint(tmp_path / "ckpt", 1, model, optimizer, scheduler)
    files = sorted(p.relative_to(tmp_path / "ckpt").as_posix()
                   for p in (tmp_path / "ckpt").rglob("*") if p.is_file())  # fmt: skip
    assert files == ["COMPLETE", "plain.json", "rank_0.json", "shards/__0_data.bin",
                     "shards/index.json"]  # fmt: skip
    for name in ("plain.json", "rank_0.json", "shards/index.json"):
        json.loads((tmp_path / "ckpt" / name).read_text())
    index = json.loads((tmp_path / "ckpt" / "shards" / "index.json").read_text())
    stored = sum(c["length"] for t in index["tensors"].values() for c in t["chunks"])
    assert stored == (tmp_path / "ckpt" / "shards" / "__0_data.bin").stat().st_size
    assert not (tmp_path / "ckpt" / "shards" / "__0_data.bin").read_bytes().startswith(b"PK")


class Planted:
    """What an attacker writes into a run directory: unpickling it runs `os.mkdir(path)`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (os.mkdir, (str(self.path),))


def save_in_the_pickled_format(directory: Path, model, optimizer, scheduler, step: int) -> None:
    """A checkpoint as asyncrl wrote it before this format: DCP's own files, `torch.save`."""
    directory.mkdir(parents=True)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state},
             checkpoint_id=directory / "shards", no_dist=True)  # fmt: skip
    torch.save({"step": step, "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(), "world_size": 1},
               directory / "rank_0.pt")  # fmt: skip
    mark_complete(directory, step)


def plant_in_a_byte_item(shards: Path, payload: object) -> None:
    """Keep a genuine index but point `param_groups.0.lr` at a pickle appended to the data."""
    metadata = pickle.loads((shards / ".metadata").read_bytes())  # the test wrote it itself
    data = shards / "__0_0.distcp"
    offset = data.stat().st_size
    with open(data, "ab") as out:
        torch.save(payload, out)
    for index, info in metadata.storage_data.items():
        if index.fqn == "optimizer.param_groups.0.lr":
            info.offset, info.length = offset, data.stat().st_size - offset
    (shards / ".metadata").write_bytes(pickle.dumps(metadata))


@pytest.mark.parametrize("where", ["metadata", "byte_item"])
def test_resuming_from_a_planted_pickled_checkpoint_runs_nothing(
    tiny_model_dir: Path, tmp_path: Path, where: str
) -> None:
    model, optimizer, scheduler = setup(tiny_model_dir)
    checkpoint = tmp_path / "checkpoints" / "step_3" / "trainer"
    save_in_the_pickled_format(checkpoint, model, optimizer, scheduler, 3)
    marker = tmp_path / "code-ran"
    if where == "metadata":
        (checkpoint / "shards" / ".metadata").write_bytes(pickle.dumps(Planted(marker)))
    else:
        plant_in_a_byte_item(checkpoint / "shards", Planted(marker))
    with pytest.raises(Exception) as refused:  # what it must not do is checked first
        load_trainer_checkpoint(checkpoint, model, optimizer, scheduler)
    assert not marker.exists(), "resuming ran the code planted in the checkpoint"
    assert isinstance(refused.value, ConfigError)
    assert "Python pickles" in str(refused.value) and "asyncrl migrate-checkpoint" in str(
        refused.value
    )
    # its owner's explicit conversion does not run it either: it stops, naming the item
    assert asyncrl_main(["migrate-checkpoint", str(tmp_path)]) == 2
    assert not marker.exists()
    assert (checkpoint / "shards" / ".metadata").exists()  # left as it was


def test_a_trusted_pickled_checkpoint_converts_and_resumes_exactly(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model, optimizer, scheduler = setup(tiny_model_dir)
    for _ in range(2):
        train_a_step(model, optimizer, scheduler)
    torch.manual_seed(7)
    checkpoint = tmp_path / "run" / "checkpoints" / "step_2" / "trainer"
    save_in_the_pickled_format(checkpoint, model, optimizer, scheduler, 2)
    expected_noise = torch.rand(3)
    train_a_step(model, optimizer, scheduler)
    expected = {n: p.detach().clone() for n, p in model.named_parameters()}

    assert asyncrl_main(["migrate-checkpoint", str(tmp_path / "run")]) == 0
    assert not (checkpoint / "shards" / ".metadata").exists()
    assert (checkpoint / "COMPLETE").exists() and (checkpoint / "rank_0.json").exists()
    fresh, fresh_optimizer, fresh_scheduler = setup(tiny_model_dir)
    assert load_trainer_checkpoint(checkpoint, fresh, fresh_optimizer, fresh_scheduler) == 2
    assert torch.equal(torch.rand(3), expected_noise)
    assert fresh_scheduler.state_dict() == scheduler.state_dict() | {
        "last_epoch": 2, "_step_count": 3, "_last_lr": fresh_scheduler.get_last_lr()
    }  # fmt: skip
    train_a_step(fresh, fresh_optimizer, fresh_scheduler)
    for name, parameter in fresh.named_parameters():
        assert torch.allclose(parameter, expected[name], atol=1e-7), name


def test_a_single_process_checkpoint_of_an_early_version_is_refused_with_a_reason(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model, optimizer, scheduler = setup(tiny_model_dir)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    save_model(model, str(legacy / "weights.safetensors"))
    torch.save({"step": 1, "optimizer": optimizer.state_dict()}, legacy / "state.pt")
    with pytest.raises(ConfigError, match=r"single-process checkpoint .* pickle"):
        load_trainer_checkpoint(legacy, model, optimizer, scheduler)


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

    index = json.loads((tmp_path / "ckpt" / "shards" / "index.json").read_text())
    keys = [key for key in index["tensors"] if key.startswith("model.")]
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


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda t: t.update(dtype="object"), "dtype 'object'"),
        (lambda t: t["chunks"][0].update(file="../../../etc/passwd"), "not a data file"),
        (lambda t: t["chunks"][0].update(length=t["chunks"][0]["length"] + 4), "bytes, not"),
        (lambda t: t["chunks"][0].update(sizes=[10**6, 1]), "outside"),
        (lambda t: t["chunks"][0].update(offset=10**9), "ends before"),
    ],
)
def test_a_tampered_index_is_refused_naming_the_file(
    tiny_model_dir: Path, tmp_path: Path, change, complaint: str
) -> None:
    model, optimizer, scheduler = setup(tiny_model_dir)
    save_trainer_checkpoint(tmp_path / "ckpt", 1, model, optimizer, scheduler)
    index_path = tmp_path / "ckpt" / "shards" / "index.json"
    index = json.loads(index_path.read_text())
    change(index["tensors"]["model.model.embed_tokens.weight"])
    index_path.write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=complaint) as refused:
        load_trainer_checkpoint(tmp_path / "ckpt", model, optimizer, scheduler)
    assert "/ckpt/shards" in str(refused.value)
