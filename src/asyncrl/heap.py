"""Keep freed tensor memory in the process instead of handing it back to the kernel each time.

torch's CPU tensors come from glibc `malloc`. A block larger than malloc's mmap threshold is
mapped fresh and unmapped when freed, and the heap's free top is returned to the kernel above
the trim threshold; either way the next tensor of that size starts on untouched pages, and the
kernel zeroes each 4 KiB page on its first write (a minor page fault). The embedded engine
makes a [rows, vocabulary] logits tensor and its sampler's copies every decode pass (12.5 MB
each at 64 rows of a 49k vocabulary): 3.1–4.1 million minor faults in a two-minute generation
run, 0.5 million with the thresholds below, and the engine 2–8 % faster at 64 rows (at 32, no
difference resolved; benchmarks/RESULTS.md, 2026-11-28 (evening)). Tensors above 32 MiB (the
ceiling of glibc's own dynamic threshold, and half of a thread arena's heap, which a larger block
could not come from anyway) are still mapped per allocation: the trainer's logits.

The thresholds hold in malloc's main arena. A thread that is not the main one (the engine steps
on its own) gets an arena of its own made of 64 MiB heaps, and a heap that empties is unmapped
whatever the thresholds: a decode pass whose temporaries outgrow one heap faulted its pages in
afresh every pass — 0.7–0.9 million faults per 128 passes at 64 rows in some engine processes,
a few hundred in others, by where the pass's blocks happened to fall (RESULTS, 2026-11-28
(late)). So every thread here allocates from the main arena (`M_ARENA_MAX` 1); its lock is
uncontended in practice, since one thread of a role does the tensor work. The cost: a process
keeps up to its peak of such blocks instead of returning them.

Applied as each role starts (`asyncrl.cli`, the launcher included, so roles forked from it
inherit no other arena), before it allocates tensors. glibc's own `MALLOC_MMAP_THRESHOLD_` /
`MALLOC_TRIM_THRESHOLD_` / `MALLOC_ARENA_MAX` (or the same in `GLIBC_TUNABLES`) in the
environment win: set any and asyncrl leaves malloc alone; `ASYNCRL_KEEP_FREED_MEMORY=0` leaves
malloc's defaults (to compare). Elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

from asyncrl.log import get_logger

logger = get_logger(__name__)

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
# glibc's ceiling for its own dynamic threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
TRIM_THRESHOLD = 1024 * 1024 * 1024  # a freed heap top up to 1 GiB stays for the next tensors
GLIBC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")
GLIBC_TUNABLE_NAMES = (
    "glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.arena_max",
)  # fmt: skip
SWITCH = "ASYNCRL_KEEP_FREED_MEMORY"


def keep_freed_memory() -> bool:
    """Raise malloc's mmap and trim thresholds in this process and give every thread the main
    arena; True if all three were set. A `ASYNCRL_KEEP_FREED_MEMORY` other than 1 or 0 is a
    ValueError naming it."""
    switch = os.environ.get(SWITCH, "1")
    if switch not in ("0", "1"):
        raise ValueError(
            f"{SWITCH}={switch!r}: expected 1 (keep freed memory, the default) or 0 (malloc's "
            "own thresholds)"
        )
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if switch == "0" or not sys.platform.startswith("linux"):
        return False
    if any(v in os.environ for v in GLIBC_VARIABLES):
        return False
    if any(name in tunables for name in GLIBC_TUNABLE_NAMES):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: its C library's
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1
    done = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
    done = mallopt(M_ARENA_MAX, 1) == 1 and done
    if not done:
        logger.debug("mallopt refused some of asyncrl's settings; malloc keeps its defaults there")
    return done
