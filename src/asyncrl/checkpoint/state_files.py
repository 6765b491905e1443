"""A state dict on disk without pickle: tensors as DCP shards, plain values and per-rank state as
JSON. The trainer's checkpoint and the migration of older checkpoints both write through here.

    <directory>/shards/index.json, __<rank>_data.bin   tensors (`tensor_storage.py`)
    <directory>/plain.json                             everything else of the state dict
    <directory>/rank_<r>.json                          step, scheduler, RNG of rank r
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from asyncrl.checkpoint.plain_values import (
    CheckpointRefused,
    dumps,
    loads,
    rng_from_text,
    rng_to_text,
    split_tensors,
)
from asyncrl.checkpoint.tensor_storage import TensorReader, TensorWriter
from asyncrl.config.loading import deep_merge
from asyncrl.fs import atomic_write_bytes

SHARDS = "shards"
PLAIN = "plain.json"
PICKLED_METADATA = ".metadata"  # DCP's own index: a pickle (asyncrl before this format)
LEGACY_WEIGHTS = "weights.safetensors"  # the single-process format before sharded checkpoints
MIGRATE = "asyncrl migrate-checkpoint"


def rank_file(directory: Path, rank: int) -> Path:
    return directory / f"rank_{rank}.json"


def refuse_older_formats(directory: Path) -> None:
    """Raise `CheckpointRefused` for a checkpoint of an earlier asyncrl: they hold pickles,
    which can run any code when loaded."""
    if (directory / SHARDS / PICKLED_METADATA).exists():
        raise CheckpointRefused(
            f"{directory} is a checkpoint of an earlier asyncrl: its index "
            f"({SHARDS}/{PICKLED_METADATA}) and optimizer values are Python pickles, and loading "
            "a pickle runs whatever code it names, so this version does not. If you trust it "
            f"(you or your run wrote it), convert it once with `{MIGRATE} {directory}` and "
            "resume again"
        )
    if (directory / LEGACY_WEIGHTS).exists():
        raise CheckpointRefused(
            f"{directory} is a single-process checkpoint of an early asyncrl (before sharded "
            "checkpoints): its optimizer state (state.pt) is a Python pickle, which this version "
            "does not load. Resume it with the asyncrl that wrote it until it has written a "
            f"sharded checkpoint, convert that with `{MIGRATE}`, or start afresh from its weights"
        )


def write_state(directory: Path, state: dict[str, Any], distributed: bool, is_main: bool) -> None:
    """Every rank calls this (collective when `distributed`); the main rank writes plain.json."""
    tensors, plain = split_tensors(state)
    dcp.save(tensors, storage_writer=TensorWriter(directory / SHARDS), no_dist=not distributed)
    if is_main:
        atomic_write_bytes(directory / PLAIN, dumps(plain))


def read_state(directory: Path, state: dict[str, Any], distributed: bool) -> dict[str, Any]:
    """`state` (this rank's tensors, shaped as it will use them) filled from `directory`, with the
    checkpoint's plain values in place of its own (collective when `distributed`)."""
    refuse_older_formats(directory)
    tensors, _ = split_tensors(state)
    reader = TensorReader(directory / SHARDS)
    reader.read_metadata()  # a bad index is refused here, by name, not inside DCP's collectives
    try:
        dcp.load(tensors, storage_reader=reader, planner=DefaultLoadPlanner(),
                 no_dist=not distributed)  # fmt: skip
    except CheckpointException as failed:  # DCP wraps what a rank raised: say it plainly
        for error, _ in failed.failures.values():
            if isinstance(error, CheckpointRefused):
                raise error from None
        raise
    plain_path = directory / PLAIN
    try:
        plain = loads(plain_path.read_bytes(), str(plain_path))
    except FileNotFoundError:
        raise CheckpointRefused(f"{plain_path} is missing: not a complete checkpoint") from None
    return deep_merge(tensors, plain)  # `split_tensors` undone: one nested dict again


def write_rank_state(
    directory: Path, rank: int, step: int, scheduler: dict[str, Any], world_size: int
) -> None:
    record = {
        "step": step,
        "scheduler": scheduler,
        "torch_rng": rng_to_text(torch.get_rng_state()),
        "world_size": world_size,
    }
    atomic_write_bytes(rank_file(directory, rank), dumps(record))


def read_rank_state(directory: Path, rank: int) -> tuple[int, dict[str, Any], torch.Tensor]:
    """(step, scheduler state, RNG state) of `rank`, or of rank 0 when it wrote none."""
    path = rank_file(directory, rank)
    if not path.exists():
        path = rank_file(directory, 0)
    try:
        record = loads(path.read_bytes(), str(path))
    except FileNotFoundError:
        raise CheckpointRefused(f"{path} is missing: not a complete checkpoint") from None
    step, scheduler = record.get("step"), record.get("scheduler")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointRefused(f"{path}: step {step!r} is not a natural number")
    if not isinstance(scheduler, dict):
        raise CheckpointRefused(f"{path}: scheduler is not an object")
    return step, scheduler, rng_from_text(record.get("torch_rng"), str(path))
