"""A core lent while its owner waits: the trainer's core runs a thread of the engine's while the
trainer has no batch to train.

On a CPU-only machine `asyncrl rl` gives the trainer and the inference server a core each
(`cpu_affinity.py`). Whichever is the slower role, the other one's core idles for part of every
step, and early in a run on a hard task, once the trainer skips the samples with nothing to
teach (`trainer/zero_advantage.py`), it is the trainer that waits most of each step for the
engine. So the trainer says when it waits, and the engine runs on its core meanwhile:

- the lender (the trainer) holds a flag file (`ASYNCRL_LEND_FLAG`) for as long as it waits for a
  batch (`lending()`), and removes it the moment a batch arrives; once it has trained its last
  step it leaves the flag for good (`lend_for_good()`): the run's last evaluations are
  generated on both cores;
- the borrower (the embedded engine, on its own thread) looks for the flag before each step
  (one `stat`) and runs with one more torch thread per lent core (`ASYNCRL_LENT_CPUS`) while it
  exists, each new worker thread pinned to a lent core, and with its own count otherwise
  (`Borrower.before_step`).

The engine hands the core back within one step of the trainer's batch arriving (a decode step
takes tens of milliseconds, a prefill longer); its own thread never leaves its own core, and a
worker of its own count is never moved. The thread count decides how matmuls split their work,
so a step run with a lent core may differ from one without in the last bits of a logprob.

The launcher sets both variables only for a one-process trainer beside the embedded engine, on
a CPU-only machine whose cores it splits itself (a user's `OMP_NUM_THREADS` turns the split,
and lending, off; so does `lend_idle_cores: false`). A flag a killed trainer left behind is
removed when the next one starts (`stop_lending`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from asyncrl.cpu_affinity import parse_cores
from asyncrl.log import get_logger

logger = get_logger(__name__)

LEND_FLAG_ENV = "ASYNCRL_LEND_FLAG"
LENT_CPUS_ENV = "ASYNCRL_LENT_CPUS"
TASKS = Path("/proc/self/task")  # one entry per thread of this process (Linux)


def stop_lending() -> None:
    """(the lender, as it starts) Remove a flag a predecessor left behind: a trainer killed while
    it waited lends its core to nobody's benefit until its successor's first wait."""
    flag = os.environ.get(LEND_FLAG_ENV)
    if flag:
        with contextlib.suppress(OSError):
            os.unlink(flag)


def lend_for_good() -> None:
    """(the lender, after its last step) Lend this process's cores for the rest of the run: the
    orchestrator's last evaluations still generate after the trainer is done. The flag stays;
    the launcher removes it before the next run in this directory starts (`local.py`)."""
    flag = os.environ.get(LEND_FLAG_ENV)
    if flag:
        try:
            Path(flag).touch()
        except OSError as error:
            logger.warning("core lending: cannot write %s (%s); not lending", flag, error)


@contextlib.contextmanager
def lending() -> Iterator[None]:
    """(the lender) Lend this process's cores for the duration of the body: the flag exists
    from entry to exit, whatever the body does."""
    flag = os.environ.get(LEND_FLAG_ENV)
    if not flag:
        yield
        return
    try:
        Path(flag).touch()
    except OSError as error:  # lending is an optimisation: never a reason to stop training
        logger.warning("core lending: cannot write %s (%s); not lending", flag, error)
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(flag)


def _thread_ids() -> set[int]:
    return {int(name) for name in os.listdir(TASKS)}


def _torch():  # type: ignore[no-untyped-def]
    """torch, imported where a borrower runs: the launcher and the trainer's `lending` import
    this module too, and the launcher decides without torch."""
    import torch

    return torch


def _start_team() -> None:
    """One parallel region at the calling thread's torch thread count, so that every worker of
    that count exists: 2**20 elements is 32 of torch's 32,768-element grains."""
    _torch().ones(1 << 20).add_(1.0)


class Borrower:
    """(the borrower) Switches the calling thread's torch thread count as the flag comes and
    goes; call `before_step` on the thread that computes, before each step."""

    def __init__(self, flag: str, lent: list[int]) -> None:
        self.flag = flag
        self.lent = lent
        self.own = _torch().get_num_threads()
        self.current = self.own
        self.owner = threading.get_native_id()
        self.pinned: set[int] = set()  # the workers moved to a lent core
        _start_team()  # the engine's own workers exist before any diff, and are never moved

    @classmethod
    def from_environment(cls) -> Borrower | None:
        """A borrower when the launcher lent this process cores, else None."""
        flag, text = os.environ.get(LEND_FLAG_ENV), os.environ.get(LENT_CPUS_ENV)
        if not flag or not text or not TASKS.is_dir() or not hasattr(os, "sched_setaffinity"):
            return None
        try:
            lent = sorted(parse_cores(text, LENT_CPUS_ENV))
        except ValueError as error:
            logger.warning("core lending: %s; not borrowing", error)
            return None
        return cls(flag, lent) if lent else None

    def before_step(self) -> None:
        lent = os.path.exists(self.flag)
        wanted = self.own + len(self.lent) if lent else self.own
        if wanted == self.current:
            return
        before = _thread_ids() if lent else set()
        _torch().set_num_threads(wanted)
        self.current = wanted
        if lent:
            self._pin_new_workers(before)

    def _pin_new_workers(self, before: set[int]) -> None:
        """Start the wider team (one parallel region) and pin each thread it added to a lent
        core. The team keeps its threads between regions and reuses them when it grows again,
        so this pins the workers once, the first time."""
        _start_team()
        new = sorted(_thread_ids() - before - {self.owner})
        for index, thread in enumerate(new):
            core = self.lent[index % len(self.lent)]
            try:
                os.sched_setaffinity(thread, {core})
            except OSError as error:  # the thread ended, or the core is not ours to use
                logger.warning("core lending: thread %d not pinned to %d (%s)", thread, core, error)
                continue
            self.pinned.add(thread)
        if new:
            logger.info("core lending: worker thread(s) %s on lent core(s) %s", new, self.lent)
