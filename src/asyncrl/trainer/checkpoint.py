"""Trainer checkpoints: weights, optimizer, scheduler, RNG and step, written atomically, and
read back without unpickling anything.

Model and optimizer tensors go through `torch.distributed.checkpoint` (DCP) into `shards/`, with
asyncrl's own storage (`checkpoint/tensor_storage.py`: raw bytes and a JSON index): each rank
writes the shards it holds, and any number of ranks can read them back (DCP reshards on load),
so a checkpoint written by N ranks resumes on M. One process is the N = 1 case of the same
format. Their plain values (the optimizer's `param_groups`) go to `plain.json`, and each rank's
step, scheduler and RNG to `rank_<r>.json`. A rank with no file of its own (more ranks than
wrote the checkpoint) takes rank 0's.

Nothing in a checkpoint can run code when it is loaded, so a run that resumes by itself from
the newest step never runs what someone planted in its run directory. Checkpoints of earlier
versions hold pickles (DCP's `.metadata`, `torch.save` files) and are refused with a message:
`asyncrl migrate-checkpoint` converts the sharded ones once, when their owner trusts them.

The directory is filled under a temporary sibling name that every rank writes into, renamed
whole by rank 0 once all have finished, then marked COMPLETE.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from asyncrl.checkpoint.layout import mark_complete
from asyncrl.checkpoint.state_files import (
    read_rank_state,
    read_state,
    write_rank_state,
    write_state,
)
from asyncrl.trainer.parallel import SINGLE_PROCESS, Ranks, barrier
from asyncrl.trainer.quantized_base import is_quantized


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
    write_state(
        staging, {"model": _saved_part(model, model_state), "optimizer": optimizer_state},
        distributed=ranks.distributed, is_main=ranks.is_main,
    )  # fmt: skip
    write_rank_state(staging, ranks.rank, step, scheduler.state_dict(), ranks.world_size)
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
    after. An older, pickled checkpoint raises `CheckpointRefused` before anything is read."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = read_state(
        directory,
        {"model": _saved_part(model, model_state), "optimizer": optimizer_state},
        ranks.distributed,
    )
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
        options=StateDictOptions(strict=not is_quantized(model)),
    )  # fmt: skip
    step, scheduler_state, rng = read_rank_state(directory, ranks.rank)
    scheduler.load_state_dict(scheduler_state)
    torch.set_rng_state(rng)
    return step
