"""Atomic writes: a reader never finds a half-written file or directory under its final name,
and a crash leaves the old content or the new one there. What a crash leaves staged
(`.<name>.….tmp`) is never read; its owner removes it at its next start
(`step_dirs.remove_staging_leftovers`)."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling directory to fill; on success it replaces `path` whole.

    A directory cannot be renamed over a non-empty one: the two are exchanged in one system
    call (Linux `renameat2(RENAME_EXCHANGE)`), and the old one, now under the temporary name,
    is removed. Where the filesystem cannot exchange, the old one is renamed aside first, and
    for that instant `path` is missing (never half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield temporary
        old = None
        if path.exists() and exchange(temporary, path):
            old = temporary
        else:
            if path.exists():
                old = path.parent / f".{path.name}.old.{uuid.uuid4().hex[:8]}.tmp"
                os.replace(path, old)
            os.replace(temporary, path)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    fsync_directory(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100
_renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)  # glibc >= 2.28


def exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically; False where the C library or filesystem cannot."""
    if _renameat2 is None:
        return False
    names = os.fsencode(first), os.fsencode(second)
    if _renameat2(_AT_FDCWD, names[0], _AT_FDCWD, names[1], _RENAME_EXCHANGE) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(error, os.strerror(error), str(second))


def fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (a crash after it must not undo it)."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
