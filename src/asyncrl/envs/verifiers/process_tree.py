"""The processes a worker started, found by parentage, so that killing it leaves none behind.

verifiers starts each tool server (and a harness program) in a session of its own, so killing a
worker's session does not reach them, and once the worker is gone they belong to init. The pool
remembers its workers' descendants (`descendants`, read from /proc, with each one's start time
so a reused pid is never mistaken for one of them) and kills them with the worker (`kill`).
Linux only; elsewhere there is nothing to remember.
"""

from __future__ import annotations

import contextlib
import os
import signal

Process = tuple[int, int]  # (pid, start time in clock ticks since boot)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of `pid`, None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> list[Process]:
    """Every living process below `root`, with its start time."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    children: dict[int, list[Process]] = {}
    for entry in entries:
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append((int(entry), stat[1]))
    found, frontier = [], [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child[0])
    return found


def kill(processes: list[Process]) -> None:
    """SIGKILL each process that is still the one remembered, and its process group."""
    for pid, started in processes:
        stat = _stat(pid)
        if stat is None or stat[1] != started:
            continue  # gone, or its pid now belongs to another process
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
