"""The heartbeat thread beats only when asked to, and silence is measured from the last beat."""

from __future__ import annotations

import time
from pathlib import Path

from asyncrl.heartbeat import HEARTBEAT_ENV, silent_for, start_heartbeat


def test_no_heartbeat_unless_the_environment_names_a_file() -> None:
    assert start_heartbeat({}) is None


def test_the_thread_beats_and_silence_counts_from_the_last_beat(tmp_path: Path) -> None:
    path = tmp_path / "beats" / "role.heartbeat"
    assert silent_for(path) is None  # before the first beat
    thread = start_heartbeat({HEARTBEAT_ENV: str(path)})
    assert thread is not None and thread.daemon
    deadline = time.monotonic() + 5
    while not path.exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    beat = path.stat().st_mtime
    assert silent_for(path, now=beat + 7.5) == 7.5
    silence = silent_for(path)
    assert silence is not None and silence < 2.0
