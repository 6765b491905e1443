"""Which cores a role's process may run on: set by the launcher, applied by the role itself.

On a CPU-only machine `asyncrl rl` gives the trainer and the inference server a share of the
cores each (their torch threads, `OMP_NUM_THREADS`) and pins each to its own share
(`ASYNCRL_CPUS`, applied with `sched_setaffinity` as the role starts), so that neither's
threads are moved onto the other's cores and each keeps its caches warm. The orchestrator and
reward workers are light and bursty and run anywhere. The cores shared out are those this
process may use (`taskset`, a cgroup), not every core of the machine.
"""

from __future__ import annotations

import os

from asyncrl.log import get_logger

logger = get_logger(__name__)

CPUS_ENV = "ASYNCRL_CPUS"


def usable_cores() -> list[int]:
    """The cores this process may run on, in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def format_cores(cores: list[int]) -> str:
    return ",".join(str(core) for core in cores)


def parse_cores(text: str, variable: str = CPUS_ENV) -> set[int]:
    """`0,2-3` -> {0, 2, 3}; a clear error, naming `variable`, for anything else."""
    cores: set[int] = set()
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"{variable}={text!r}: expected core numbers like 0,2-3")
        cores.update(range(int(low), int(high or low) + 1))
    return cores


def apply_cpu_affinity() -> None:
    """Pin this process (and the threads and children it starts) to `ASYNCRL_CPUS`, if set."""
    text = os.environ.get(CPUS_ENV)
    if not text or not hasattr(os, "sched_setaffinity"):
        return
    cores = parse_cores(text) & set(usable_cores())
    if not cores:
        logger.warning("%s=%s names no core this process may use; not pinned", CPUS_ENV, text)
        return
    os.sched_setaffinity(0, cores)
    logger.info("pinned to cores %s", format_cores(sorted(cores)))
