"""Peak memory per phase of a process that takes turns (a colocated trainer: generation, then
training): on a GPU the CUDA allocator's peak, on the CPU the peak resident set (VmHWM), each
reset at the start of the next phase.
"""

from __future__ import annotations

from pathlib import Path

import torch

from asyncrl.log import get_logger

logger = get_logger(__name__)

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


class PhasePeaks:
    """`take()` returns the peak bytes since the previous call (None where it cannot be told)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.resettable = self.cuda or _reset_cpu_peak()
        if not self.resettable:
            logger.warning("peak memory per phase not measured: %s is not writable", CLEAR_REFS)

    def take(self) -> int | None:
        if self.cuda:
            peak = int(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
            return peak
        if not self.resettable:
            return None
        peak = _status_bytes("VmHWM")
        _reset_cpu_peak()
        return peak


def resident_bytes() -> int | None:
    """The resident set now (None off Linux)."""
    return _status_bytes("VmRSS")


def _status_bytes(field: str) -> int | None:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        return None
    return None


def _reset_cpu_peak() -> bool:
    """Linux resets VmHWM to the current resident set when "5" is written to clear_refs."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True
