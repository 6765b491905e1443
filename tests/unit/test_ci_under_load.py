"""`scripts/ci_under_load.sh`: the command runs beside the stated number of spinning processes,
the script says what load it used, exits with the command's code, and leaves no spinner."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ci_under_load.sh"


def spinners_of(script_pid: int) -> list[str]:
    result = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True)
    return [line for line in result.stdout.splitlines() if f" spin {script_pid}" in line]


def test_the_command_runs_beside_the_stated_spinners_and_none_outlives_it() -> None:
    # the command counts the spinners of its parent, the script
    count = 'ps -eww -o args | grep -c "^sh -c .* spin $PPID$"; exit 3'
    run = subprocess.Popen(
        [str(SCRIPT), "--busy", "2", "--nice", "19", "--", "sh", "-c", count],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    output, _ = run.communicate(timeout=60)
    assert run.returncode == 3, output
    lines = output.splitlines()
    assert lines[0].startswith("ci_under_load: 2 spinning process(es) at nice 19"), output
    assert lines[1] == "2", output  # both were spinning while the command ran
    assert lines[2].startswith("ci_under_load: 2 spinning process(es) at nice 19 took "), output
    assert lines[2].endswith("the command exited with 3"), output
    assert not spinners_of(run.pid)


def test_a_killed_script_leaves_no_spinner() -> None:
    run = subprocess.Popen(
        [str(SCRIPT), "--busy", "1", "--nice", "19", "--", "sleep", "30"],
        stdout=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not spinners_of(run.pid):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        run.send_signal(signal.SIGKILL)  # no trap runs: the spinner sees the script gone
        run.wait(timeout=10)
        deadline = time.monotonic() + 10
        while spinners_of(run.pid):
            assert time.monotonic() < deadline, spinners_of(run.pid)
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)  # its `sleep`
