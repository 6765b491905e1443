"""A heartbeat file that a supervisor reads to tell a hung process from a slow one.

When the environment names a file in `ASYNCRL_HEARTBEAT`, a daemon thread touches it every
second. A process that is stopped (SIGSTOP), frozen by its machine, or wedged in a call that
holds the interpreter lets it go stale; a process that is merely busy (a long step, a model
load) keeps it fresh. Who set the variable, a launcher or a user, is no business of the process.

Ranks of one trainer started together (`LOCAL_WORLD_SIZE` > 1: `asyncrl train`'s own launcher,
torchrun) inherit the same variable; each beats `<file>.rank<RANK>` of its own instead, and
`silent_for` reads the stalest of the file and its rank files: one frozen rank shows, however
busy the others are.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from pathlib import Path

HEARTBEAT_ENV = "ASYNCRL_HEARTBEAT"
INTERVAL_S = 1.0


def start_heartbeat(environ: dict[str, str] | None = None) -> threading.Thread | None:
    """Beat into the file named by `ASYNCRL_HEARTBEAT` until the process ends (None if unset)."""
    environ = os.environ if environ is None else environ
    target = environ.get(HEARTBEAT_ENV)
    if not target:
        return None
    path = Path(target)
    if int(environ.get("LOCAL_WORLD_SIZE", "1")) > 1 and "RANK" in environ:
        path = rank_heartbeat(path, int(environ["RANK"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    thread = threading.Thread(target=_beat, args=(path,), name="heartbeat", daemon=True)
    thread.start()
    return thread


def _beat(path: Path) -> None:
    """Touch `path` every second; a failed touch (the directory removed, a full disk) is tried
    again next time rather than ending the thread, whose silence would read as a hang."""
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        except OSError:
            pass
        time.sleep(INTERVAL_S)


def rank_heartbeat(path: Path, rank: int) -> Path:
    return path.with_name(f"{path.name}.rank{rank}")


def _beats(path: Path) -> list[float]:
    """The last beat of `path` and of each of its rank files (the ones that exist)."""
    found = []
    for beating in [path, *path.parent.glob(f"{glob.escape(path.name)}.rank*")]:
        try:
            found.append(beating.stat().st_mtime)
        except FileNotFoundError:
            continue
    return found


def silent_for(path: Path, now: float | None = None) -> float | None:
    """Seconds since the last beat of the stalest of `path` and its rank files; None before
    the first beat."""
    beats = _beats(path)
    if not beats:
        return None
    return max(0.0, (time.time() if now is None else now) - min(beats))


def clear_heartbeat(path: Path) -> None:
    """Forget every beat of a process (and of its ranks) before it is started again."""
    path.unlink(missing_ok=True)
    for rank_file in path.parent.glob(f"{glob.escape(path.name)}.rank*"):
        rank_file.unlink(missing_ok=True)
