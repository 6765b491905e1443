"""A run's role processes, for the tests that kill or freeze one mid-run.

Such a test races the run's end: six steps of the tiny model leave 0.9 s between the server's
weights version 3 and the trainer's exit on an idle 2-core Intel (1.5 s at load average 6), so a
test that looked a role up with `ps` only once its trigger had passed found no trainer when the
machine was busy (a CI run at 1.40x its usual pace). Here a role's pid is found while the test
waits for the role to come up, before the trigger, and a signal goes only to a process that has
not exited yet; otherwise the test says that the run ended first, not that a list was short.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from .test_rl_launcher import survivors


def role_marker(role: str) -> str:
    """What a role's command line holds: `python -m asyncrl.cli <role> <config>` (a forked role
    sets it once it runs; until then it shows the launcher's own `asyncrl.cli rl ...`)."""
    return f"asyncrl.cli {role} "


def wait_for_pid(
    output: Path,
    marker: str,
    launcher: subprocess.Popen[Any],
    other_than: int | None = None,
    timeout: float = 300.0,
) -> int:
    """The pid of the one process of the run in `output` whose command line holds `marker`
    (and is not `other_than`: the process a restart replaces), waiting until it exists."""
    deadline = time.monotonic() + timeout
    while True:
        running = survivors(str(output))
        lines = [line for line in running if marker in line]
        pids = [pid for pid in (int(line.split()[0]) for line in lines) if pid != other_than]
        assert len(pids) <= 1, f"{len(pids)} processes hold {marker!r}: {lines}"
        if pids:
            return pids[0]
        assert launcher.poll() is None, (
            f"the run ended (code {launcher.returncode}) with no process holding {marker!r}"
        )
        assert time.monotonic() < deadline, (
            f"no process of the run holds {marker!r} after {timeout:.0f} s: {running}"
        )
        time.sleep(0.1)


def process_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (R, S, T, Z...), None once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def signal_running(pid: int, number: signal.Signals, what: str) -> None:
    """Send `number` to `what` (pid `pid`), which must not have exited yet: a signal to a zombie
    succeeds and does nothing."""
    state = process_state(pid)
    assert state not in (None, "Z", "X"), (
        f"{what} (pid {pid}) had exited before the test could send it {number.name}: "
        "the run ended first"
    )
    os.kill(pid, number)
