"""Processes that never outlive their parent: a neutral helper for launchers and roles alike."""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1
# loaded once, here: a `preexec_fn` (between fork and exec) then only calls into it
_libc = ctypes.CDLL("libc.so.6", use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent(signal_number: int = signal.SIGTERM) -> None:
    """Ask the kernel to send us `signal_number` when our parent dies, even by SIGKILL (Linux;
    a no-op elsewhere). Safe in a `preexec_fn`: it only sets a flag, and survives exec."""
    if _libc is not None:
        _libc.prctl(PR_SET_PDEATHSIG, signal_number)
