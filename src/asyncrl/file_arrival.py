"""Waking a waiter when a file appears, instead of polling for it.

Roles hand each other work through the run directory: a batch under `rollouts/step_N/`, a
broadcast's `STABLE` marker, the `DONE` and `FINISHED` markers. A reader that polls every 50 ms
loses 25 ms on average at every hand-off, twice a step; on a 2-core machine that is a tenth of a
step. On Linux the kernel's inotify tells the waiter the moment an entry is created or renamed
into a watched directory, so the waiter sleeps until then.

The watch is on the deepest directory of the path that exists, re-aimed after every event, so a
file whose directories are still to be made (`rollouts/step_7/batch.msgpack`) is caught too.
The watch is only a wake-up: the path is checked again after each one, and at least every
`RECHECK_S` seconds, so a missed event (a network filesystem written from another node, where
inotify sees nothing) costs at most that long. Where inotify is missing, a short poll stands in.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import select
import time
from collections.abc import Callable
from pathlib import Path

RECHECK_S = 0.25  # the longest a missed event can delay a waiter (other nodes' writes)
FALLBACK_POLL_S = 0.01  # without inotify

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
# an entry created or moved in; the watched directory itself deleted or moved away
_IN_CREATE, _IN_MOVED_TO, _IN_DELETE_SELF, _IN_MOVE_SELF = 0x100, 0x80, 0x400, 0x800
_MASK = _IN_CREATE | _IN_MOVED_TO | _IN_DELETE_SELF | _IN_MOVE_SELF


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1  # noqa: B018 - present only where the kernel interface is
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


class ArrivalWatch:
    """One inotify instance, re-aimed at the deepest existing directory above a path."""

    def __init__(self) -> None:
        self.fd = -1
        if _LIBC is not None:
            fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            self.fd = fd if fd >= 0 else -1  # out of instances: poll instead

    def aim(self, path: Path) -> None:
        """Watch the deepest existing directory on the way to `path` (and `path` itself when it
        is a directory, for what appears inside it). Adding a watch the instance already has
        is a cheap no-op, and a directory removed and made again needs a new one, so it is
        added every time."""
        if self.fd < 0 or _LIBC is None:
            return
        directory = path
        while not directory.is_dir() and directory != directory.parent:
            directory = directory.parent
        _LIBC.inotify_add_watch(self.fd, os.fsencode(str(directory)), _MASK)

    def sleep(self, seconds: float) -> None:
        """Until something changes in a watched directory, or `seconds` pass."""
        if seconds <= 0:
            return
        if self.fd < 0:
            time.sleep(min(seconds, FALLBACK_POLL_S))
            return
        ready, _, _ = select.select([self.fd], [], [], min(seconds, RECHECK_S))
        if ready:
            self._drain()

    async def sleep_async(self, seconds: float) -> None:
        """`sleep` for an event loop: the loop watches the descriptor meanwhile."""
        if seconds <= 0:
            return
        if self.fd < 0:
            await asyncio.sleep(min(seconds, FALLBACK_POLL_S))
            return
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        loop.add_reader(self.fd, lambda: woken.done() or woken.set_result(None))
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken, min(seconds, RECHECK_S))
        finally:
            loop.remove_reader(self.fd)
            self._drain()

    def _drain(self) -> None:
        try:
            while os.read(self.fd, 65536):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ArrivalWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until(
    done: Callable[[], bool],
    watch_paths: list[Path],
    timeout: float | None,
    on_wait: Callable[[], None] | None = None,
) -> bool:
    """Block until `done()` is true, waking whenever something appears on the way to one of
    `watch_paths`. False after `timeout` seconds (None: no limit). `on_wait` runs before each
    sleep (a `Wait.check`, to say what is awaited and raise past a deadline of its own)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with ArrivalWatch() as watch:
        while True:
            for path in watch_paths:
                watch.aim(path)  # aimed before the check: nothing can slip in between
            if done():
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if on_wait is not None:
                on_wait()
            watch.sleep(RECHECK_S if left is None else left)
