"""Trainer checkpoints: weights, optimizer, scheduler, RNG and step, written atomically.

Model and optimizer go through `torch.distributed.checkpoint` (DCP) into `shards/`: each rank
writes the shards it holds, and any number of ranks can read them back (DCP reshards on load),
so a checkpoint written by N ranks resumes on M. One process is the N = 1 case of the same
format. The step, scheduler and RNG of each rank go to `rank_<r>.pt` (`torch.save`, read back
with `weights_only=True`, which refuses anything but tensors and plain containers: nothing in a
checkpoint can run code when loaded). A rank with no file of its own (more ranks than wrote
the checkpoint) takes rank 0's.

The directory is filled under a temporary sibling name that every rank writes into, renamed
whole by rank 0 once all have finished, then marked COMPLETE. Checkpoints of earlier versions
(`weights.safetensors` + `state.pt`, one process) still load on one rank.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_model
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from asyncrl.checkpoint.layout import mark_complete
from asyncrl.trainer.parallel import SINGLE_PROCESS, Ranks, barrier
from asyncrl.trainer.quantized_base import is_quantized

SHARDS = "shards"
LEGACY_WEIGHTS = "weights.safetensors"
LEGACY_STATE = "state.pt"


def _rank_state(directory: Path, rank: int) -> Path:
    return directory / f"rank_{rank}.pt"


def save_trainer_checkpoint(
    directory: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ranks: Ranks = SINGLE_PROCESS,
) -> None:
    """Every rank calls this (it is collective); rank 0 publishes the directory."""
    staging = directory.with_name(f".{directory.name}.tmp")
    if ranks.is_main:
        shutil.rmtree(staging, ignore_errors=True)  # a crashed earlier attempt
        staging.mkdir(parents=True)
    barrier(ranks)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    model_state = _saved_part(model, model_state)
    dcp.save(
        {"model": model_state, "optimizer": optimizer_state},
        checkpoint_id=staging / SHARDS,
        no_dist=not ranks.distributed,
    )
    torch.save(
        {
            "step": step,
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "world_size": ranks.world_size,
        },
        _rank_state(staging, ranks.rank),
    )
    barrier(ranks)
    if ranks.is_main:
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
        mark_complete(directory, step)
    barrier(ranks)


def _saved_part(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint holds of the model: everything, but for a quantized base (QLoRA) only
    the trained parameters. The frozen base is what loading the model gives again, and a
    4-bit layer's state (codes, nested scales, code tables) does not load back in place."""
    if not is_quantized(model):
        return state
    trained = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    return {name: value for name, value in state.items() if name in trained}


def load_trainer_checkpoint(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ranks: Ranks = SINGLE_PROCESS,
) -> int:
    """Restore everything in place (collective); returns the step the checkpoint was taken
    after."""
    if (directory / LEGACY_WEIGHTS).exists():
        return _load_legacy(directory, model, optimizer, scheduler, ranks)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": _saved_part(model, model_state), "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=directory / SHARDS, no_dist=not ranks.distributed)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
        options=StateDictOptions(strict=not is_quantized(model)),
    )  # fmt: skip
    own = _rank_state(directory, ranks.rank)
    rank_state = torch.load(own if own.exists() else _rank_state(directory, 0), weights_only=True)
    scheduler.load_state_dict(rank_state["scheduler"])
    torch.set_rng_state(rank_state["torch_rng"])
    return int(rank_state["step"])


def _load_legacy(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ranks: Ranks,
) -> int:
    if ranks.distributed:
        raise RuntimeError(
            f"{directory} is a single-process checkpoint of an earlier asyncrl; resume it with "
            "trainer.world_size 1 (its next checkpoint is written in the sharded format, which "
            "any number of ranks can resume)"
        )
    load_model(model, str(directory / LEGACY_WEIGHTS), strict=True)
    state = torch.load(directory / LEGACY_STATE, weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])
