"""The arrival watch wakes a waiter when a file is renamed into place, directories and all."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from asyncrl import file_arrival
from asyncrl.file_arrival import ArrivalWatch, wait_until
from asyncrl.fs import atomic_write_bytes


@pytest.mark.skipif(file_arrival._LIBC is None, reason="inotify is Linux's")
def test_a_rename_into_a_watched_directory_wakes_the_sleeper_before_its_recheck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_arrival, "RECHECK_S", 60.0)  # only the event can wake it in time
    target = tmp_path / "rollouts" / "step_3" / "batch.msgpack"
    with ArrivalWatch() as watch:
        assert watch.fd >= 0
        watch.aim(target)  # rollouts/ does not exist yet: the watch is on tmp_path
        threading.Timer(0.2, (tmp_path / "rollouts").mkdir).start()
        started = time.monotonic()
        watch.sleep(30.0)
        assert time.monotonic() - started < 20.0
        watch.aim(target)  # re-aimed at rollouts/, then at step_3/ once it exists
        threading.Timer(0.2, atomic_write_bytes, args=(target, b"x")).start()
        while not target.exists():
            watch.aim(target)
            watch.sleep(30.0)
        assert time.monotonic() - started < 20.0


def test_wait_until_sees_a_file_made_in_new_directories_and_gives_up_at_its_timeout(
    tmp_path: Path,
) -> None:
    target = tmp_path / "a" / "b" / "STABLE"
    threading.Timer(0.1, atomic_write_bytes, args=(target, b"{}")).start()
    assert wait_until(target.exists, [target], timeout=30.0)
    started = time.monotonic()
    assert not wait_until((tmp_path / "never").exists, [tmp_path / "never"], timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 10.0


def test_without_inotify_a_short_poll_stands_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_arrival, "_LIBC", None)
    target = tmp_path / "late"
    threading.Timer(0.1, target.write_text, args=("x",)).start()
    with ArrivalWatch() as watch:
        assert watch.fd == -1
    assert wait_until(target.exists, [target], timeout=30.0)


def test_the_watch_closes_its_descriptor(tmp_path: Path) -> None:
    watch = ArrivalWatch()
    descriptor = watch.fd
    watch.close()
    if descriptor >= 0:
        with pytest.raises(OSError):
            os.fstat(descriptor)
