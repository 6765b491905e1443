"""A heartbeat file that a supervisor reads to tell a hung process from a slow one.

When the environment names a file in `ASYNCRL_HEARTBEAT`, a daemon thread touches it every
second. A process that is stopped (SIGSTOP), frozen by its machine, or wedged in a call that
holds the interpreter lets it go stale; a process that is merely busy (a long step, a model
load) keeps it fresh. Who set the variable, a launcher or a user, is no business of the process.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

HEARTBEAT_ENV = "ASYNCRL_HEARTBEAT"
INTERVAL_S = 1.0


def start_heartbeat(environ: dict[str, str] | None = None) -> threading.Thread | None:
    """Beat into the file named by `ASYNCRL_HEARTBEAT` until the process ends (None if unset)."""
    target = (os.environ if environ is None else environ).get(HEARTBEAT_ENV)
    if not target:
        return None
    path = Path(target)
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


def silent_for(path: Path, now: float | None = None) -> float | None:
    """Seconds since the last beat; None before the first."""
    try:
        beat = path.stat().st_mtime
    except FileNotFoundError:
        return None
    return max(0.0, (time.time() if now is None else now) - beat)
