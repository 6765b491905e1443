"""The trainer's batch source on one process, over the real filesystem transport: it returns
the batch the orchestrator wrote, None once the orchestrator has finished, and TimeoutError at
its deadline however the wait is sliced (the several-rank path runs in test_parallel.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from asyncrl.trainer.batch_source import BatchSource
from asyncrl.trainer.parallel import Ranks
from asyncrl.transport.rollout_transport import FilesystemReceiver, FilesystemSender
from asyncrl.transport.weights.route import WeightRoute
from asyncrl.types import TrainingBatch

ONE_PROCESS = Ranks(0, 1, torch.device("cpu"))


def source(run_dir: Path, timeout: float | None, heartbeat: float = 0.05) -> BatchSource:
    return BatchSource(FilesystemReceiver(run_dir), None, ONE_PROCESS, timeout, heartbeat)


def test_a_batch_written_while_it_waits_is_returned(tmp_path: Path) -> None:
    batch = TrainingBatch(step=1, samples=[], max_tokens=32)
    writer = threading.Timer(0.2, FilesystemSender(tmp_path).send, args=(batch,))
    writer.start()
    try:
        assert source(tmp_path, timeout=10.0).next(1) == batch  # over several slices
    finally:
        writer.join()


def test_the_end_of_the_run_is_none(tmp_path: Path) -> None:
    FilesystemSender(tmp_path).finish()
    assert source(tmp_path, timeout=10.0).next(1) is None


def test_no_batch_by_the_deadline_is_a_timeout_after_it(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        source(tmp_path, timeout=0.3).next(1)
    assert 0.3 <= time.monotonic() - started < 5.0


def test_a_route_that_raises_while_waiting_ends_the_wait_before_the_deadline(
    tmp_path: Path,
) -> None:
    """A colocated engine that gave up: no batch will come, the trainer stops at once."""

    def engine_gave_up() -> None:
        raise RuntimeError("the colocated inference engine stopped")

    class EngineRoute(WeightRoute):  # what a colocated trainer's route does while it waits
        def waiting(self) -> None:
            engine_gave_up()

    waiting = BatchSource(FilesystemReceiver(tmp_path), EngineRoute(), ONE_PROCESS, 60.0, 0.05)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="engine stopped"):
        waiting.next(1)
    assert time.monotonic() - started < 5.0
