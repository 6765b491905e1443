"""Keep freed tensor memory in the process instead of handing it back to the kernel each time.

torch's CPU tensors come from glibc `malloc`. A block larger than malloc's mmap threshold is
mapped fresh and unmapped when freed, and the heap's free top is returned to the kernel above
the trim threshold; either way the next tensor of that size starts on untouched pages, and the
kernel zeroes each 4 KiB page on its first write (a minor page fault). The embedded engine
makes a [rows, vocabulary] logits tensor and its sampler's copies every decode pass (12.5 MB
each at 64 rows of a 49k vocabulary), the trainer [tokens, vocabulary] logits of hundreds of
MB every step. What is set here, as each role starts (benchmarks/RESULTS.md, 2026-11-28
(evening) and (late)):

- mmap threshold at glibc's 32 MiB ceiling, trim threshold 1 GiB: a block up to 32 MiB, and
  a freed heap top up to 1 GiB, stay for the next tensors (the engine: 3.1–4.1 → 0.5 million
  faults in a two-minute generation run, 2–8 % faster at 64 rows);
- no block mapped on its own (`M_MMAP_MAX` 0), since the threshold cannot go past 32 MiB: the
  trainer's logits come from the heap too and are reused (a LoRA step of the quick start's
  shape: 2.1 → 0.7 million faults over a run, 5.38 → 5.02 s a step, 60 MB more peak);
- one arena for every thread (`M_ARENA_MAX` 1): a thread other than the main one (the engine
  steps on its own) got an arena of 64 MiB heaps, unmapped once empty whatever the thresholds;
  a decode pass whose temporaries outgrew one heap faulted its pages in afresh, 0.7–0.9 million
  faults per 128 passes at 64 rows in some engine processes and a few hundred in others, by
  where its blocks fell. Threads that allocate at once now wait on one lock; a role's tensor
  work runs on one thread (intra-op threads allocate little), and the engine measured no slower
  with it.

The cost: a process keeps up to its peak of freed blocks instead of returning them (a free
top past 1 GiB excepted). Applied in `asyncrl.cli` by every command (`plot` and
`migrate-checkpoint` excepted) before its first tensor and its first thread (an arena made
earlier would be reused), the launcher included, so roles forked from it inherit no other
arena. glibc's own variables win, each for its part: `MALLOC_MMAP_THRESHOLD_` or
`MALLOC_MMAP_MAX_` (the two mmap settings), `MALLOC_TRIM_THRESHOLD_`, `MALLOC_ARENA_MAX`, or the
same names in `GLIBC_TUNABLES`; `ASYNCRL_KEEP_FREED_MEMORY=0` leaves
malloc's defaults (to compare). Elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import NamedTuple

from asyncrl.log import get_logger

logger = get_logger(__name__)

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
M_ARENA_MAX = -8
# glibc's ceiling for its own dynamic threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
TRIM_THRESHOLD = 1024 * 1024 * 1024  # a freed heap top up to 1 GiB stays for the next tensors


class MallocSetting(NamedTuple):
    """What asyncrl sets (mallopt parameter, value) and the glibc variables and tunables by
    which a user sets the same thing instead."""

    parameters: tuple[tuple[int, int], ...]
    variables: tuple[str, ...]
    tunables: tuple[str, ...]


# the mmap threshold and count go together: a user's threshold means nothing without mmaps
SETTINGS = (
    MallocSetting(((M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX), (M_MMAP_MAX, 0)),
                  ("MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_"),
                  ("glibc.malloc.mmap_threshold", "glibc.malloc.mmap_max")),
    MallocSetting(((M_TRIM_THRESHOLD, TRIM_THRESHOLD),), ("MALLOC_TRIM_THRESHOLD_",),
                  ("glibc.malloc.trim_threshold",)),
    MallocSetting(((M_ARENA_MAX, 1),), ("MALLOC_ARENA_MAX",), ("glibc.malloc.arena_max",)),
)  # fmt: skip
SWITCH = "ASYNCRL_KEEP_FREED_MEMORY"


def keep_freed_memory() -> bool:
    """Raise malloc's mmap and trim thresholds in this process, map no block on its own and
    give every thread the main arena, except what the environment sets itself; True if all
    four were set here. A `ASYNCRL_KEEP_FREED_MEMORY` other than 1 or 0 is a ValueError
    naming it."""
    switch = os.environ.get(SWITCH, "1")
    if switch not in ("0", "1"):
        raise ValueError(
            f"{SWITCH}={switch!r}: expected 1 (keep freed memory, the default) or 0 (malloc's "
            "own thresholds)"
        )
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if switch == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: its C library's
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = True
    for setting in SETTINGS:
        users = [v for v in setting.variables if v in os.environ]
        users += [name for name in setting.tunables if name in tunables]
        if users:  # the user's own setting wins, for this one only
            logger.info("malloc: %s set in the environment; asyncrl leaves that alone", users[0])
            done = False
            continue
        for parameter, value in setting.parameters:
            if mallopt(parameter, value) != 1:
                logger.debug("mallopt refused parameter %d = %d", parameter, value)
                done = False
    return done
