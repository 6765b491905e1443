"""What keeps a run's own user code (rewards, tools, scorers) from reading a process that
holds a key.

Linux lets a process read another's environment and memory (`/proc/<pid>/environ`, `mem`,
`ptrace`, `process_vm_readv`, `pidfd_getfd`) when both run as the same user and the target
is "dumpable", and lets a process with CAP_SYS_PTRACE (root, as a rule) read any process. So:

- every asyncrl process that may hold a key marks itself not dumpable (`make_unreadable`,
  PR_SET_DUMPABLE 0): its `/proc` files then belong to root, and neither a process of the same
  user nor one without CAP_SYS_PTRACE may read or trace it. The flag survives `fork` (a forked
  role has it from its first instruction) but not `exec` (an exec'd process sets it itself,
  first thing: `cli.main`);
- every process that runs user code drops, before it execs, the capabilities that would read
  another process anyway (`drop_reading_capabilities`: CAP_SYS_PTRACE; CAP_SYS_ADMIN, CAP_BPF
  and CAP_PERFMON, which trace through BPF and perf; CAP_SYS_RAWIO, `/dev/mem`; CAP_SYS_MODULE,
  kernel code) from its bounding set, so that even run as root it and all it starts lack them.

Neither makes user code a sandbox: run as the run's user (or root) it can still write what
that user can, asyncrl's own code included. Off Linux both are no-ops (logged at debug level).
"""

from __future__ import annotations

import ctypes
import sys

from asyncrl.log import get_logger

logger = get_logger(__name__)

PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
PR_CAPBSET_READ, PR_CAPBSET_DROP = 23, 24
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
# capability numbers (linux/capability.h): what reads or traces another process
READING_CAPABILITIES = {
    "CAP_SYS_MODULE": 16,
    "CAP_SYS_RAWIO": 17,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
}

# loaded once, here: a `preexec_fn` (between fork and exec) then only calls into it
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def make_unreadable() -> None:
    """Mark this process not dumpable: its environment, memory and descriptors are closed to
    other processes of its user, and to any process without CAP_SYS_PTRACE."""
    if _libc is None:
        logger.debug("not Linux: this process stays readable by its user's other processes")
        return
    if _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def is_dumpable() -> bool | None:
    """Whether this process is dumpable (None off Linux)."""
    return None if _libc is None else bool(_libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))


def drop_reading_capabilities() -> None:
    """Drop `READING_CAPABILITIES` from this process's bounding set and clear its ambient set,
    so that what it execs (and all that starts) never has them, root included. Safe in a
    `preexec_fn`: only system calls. Without CAP_SETPCAP (an ordinary user, who holds none of
    them anyway) the bounding set cannot change and is left."""
    if _libc is None:
        return
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for number in READING_CAPABILITIES.values():
        if _libc.prctl(PR_CAPBSET_READ, number, 0, 0, 0) == 1:
            _libc.prctl(PR_CAPBSET_DROP, number, 0, 0, 0)


def bounding_capabilities(names: list[str] | None = None) -> set[str]:
    """Which of `READING_CAPABILITIES` (or `names` of them) this process may still have."""
    if _libc is None:
        return set()
    libc = _libc
    wanted = names or list(READING_CAPABILITIES)
    return {n for n in wanted if libc.prctl(PR_CAPBSET_READ, READING_CAPABILITIES[n], 0, 0, 0) == 1}
