"""Filesystem transport of training batches: `<run_dir>/rollouts/step_N/batch.msgpack`.

The orchestrator writes each batch to a temporary name and renames it, so the trainer never
reads half a file; a file that still fails to decode is reported with its path and the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from asyncrl.file_arrival import wait_until
from asyncrl.fs import atomic_write_bytes
from asyncrl.log import get_logger
from asyncrl.run.layout import batch_file, rollouts_dir, rollouts_done
from asyncrl.step_dirs import remove_steps_after
from asyncrl.types import TrainingBatch
from asyncrl.waiting import Wait

logger = get_logger(__name__)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(TrainingBatch)


class BatchFileError(ValueError):
    """A batch file exists but cannot be used; the message names the file."""


def done_path(run_dir: str | Path) -> Path:
    """Written by the orchestrator when it will send no more batches."""
    return rollouts_done(run_dir)


def forget_batches_after(run_dir: str | Path, step: int) -> None:
    """Before a resume from `step`: the batches a crashed run wrote later were never trained
    on, and the run is not done."""
    remove_steps_after(rollouts_dir(run_dir), step)
    done_path(run_dir).unlink(missing_ok=True)


def batch_path(run_dir: str | Path, step: int) -> Path:
    return batch_file(run_dir, step)


def last_batch_from(run_dir: str | Path, step: int) -> int:
    """The last of the batches step + 1, step + 2, … already written without a gap (`step` if
    none): a restarted orchestrator goes on after it, since the trainer may have trained them."""
    while batch_path(run_dir, step + 1).exists():
        step += 1
    return step


def encode_batch(batch: TrainingBatch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(data: bytes, source: str) -> TrainingBatch:
    try:
        batch = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise BatchFileError(f"{source}: not a valid training batch ({error})") from error
    for index, sample in enumerate(batch.samples):
        problems = sample.problems()
        if problems:
            raise BatchFileError(f"{source}: sample {index}: {'; '.join(problems)}")
    return batch


def write_batch(run_dir: str | Path, batch: TrainingBatch) -> Path:
    path = batch_path(run_dir, batch.step)
    atomic_write_bytes(path, encode_batch(batch))
    return path


def read_batch(run_dir: str | Path, step: int) -> TrainingBatch:
    path = batch_path(run_dir, step)
    batch = decode_batch(path.read_bytes(), str(path))
    if batch.step != step:
        raise BatchFileError(f"{path}: holds step {batch.step}, expected {step}")
    return batch


def wait_for_batch(
    run_dir: str | Path,
    step: int,
    timeout: float | None = None,
    report_every: float = 30.0,
    stop_if: Callable[[], bool] | None = None,
) -> TrainingBatch | None:
    """Block until batch `step` exists, then read it; says what it waits for every 30 s.
    Returns None if `stop_if()` becomes true first (the orchestrator finished). The wait wakes
    the moment the batch (or the DONE marker) is renamed into place (`file_arrival`)."""
    path = batch_path(run_dir, step)
    # a batch is usually moments away: stay quiet unless the wait gets long
    wait = Wait(f"{path} from the orchestrator", logger, timeout, report_every, report_every)
    stopped = False

    def arrived() -> bool:
        nonlocal stopped
        if path.exists():
            return True
        stopped = stop_if is not None and stop_if()
        return stopped

    wait_until(arrived, [path, done_path(run_dir)], None, on_wait=wait.check)
    return None if stopped else read_batch(run_dir, step)
