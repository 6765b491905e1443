"""Atomic writes: a reader never finds a half-written file or directory under its final name,
and a crash leaves the old content or the new one there. What a crash leaves staged
(`.<name>.….tmp`) is never read; its owner removes it at its next start
(`step_dirs.remove_staging_leftovers`; a command's output: `output_lock`).

A command's output directory (`asyncrl export`, `asyncrl get-model`) is the user's path, not
the run's: `output_directory` writes it only where nothing is lost by replacing it (missing,
empty, or an earlier output of the same command that holds nothing but what its marker lists),
never at or above what the command reads, and through a symbolic link rather than over it. What
it stages beside it has a name no one else's has (`.<name>.asyncrl-output.<32 hex>.tmp`), and
only such names are removed as leftovers; what was added to the directory while it was being
written is kept with the previous directory, never removed."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from asyncrl.log import get_logger

logger = get_logger(__name__)

STAGING = "staging"  # `.<name>.staging.<random>.tmp`: atomic_directory's default label
# a command's output is staged as `.<name>.asyncrl-output.<32 hex>.tmp`: no one else's name
OUTPUT_STAGING = "asyncrl-output"
OUTPUT_FILES = "output_files"  # the marker's list of the names the command wrote
KEPT = "previous"  # `<name>.previous-<random>`: a replaced output that held more than it listed


class OutputRefused(ValueError):
    """A command's output directory that cannot be written without losing something; the
    message names the path and what to do."""


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


def followed(path: str | Path) -> Path:
    """`path`, or the path its symbolic link points to: a directory written through a link
    lands where the link points, and the link stays."""
    path = Path(path)
    return path.resolve() if path.is_symlink() else path


@contextmanager
def atomic_directory(
    path: str | Path, label: str = STAGING, retire: Callable[[Path], None] | None = None
) -> Iterator[Path]:
    """Yield a temporary sibling directory to fill; on success it replaces `path` whole.

    A directory cannot be renamed over a non-empty one: the two are exchanged in one system
    call (Linux `renameat2(RENAME_EXCHANGE)`), and the old one, now under the temporary name,
    is removed. Where the filesystem cannot exchange, the old one is renamed aside first, and
    for that instant `path` is missing (never half-written). A symbolic link at `path` is
    followed (the directory it points to is replaced, the link kept), and the new directory
    has the mode any new directory gets (0777 less the umask), not mkdtemp's 0700. Staged as
    `.<name>.<label>.<random>.tmp`, the old one removed as `.<name>.<label>-old.<random>.tmp`
    (`retire`, given the old directory, decides what becomes of it instead: `output_directory`
    keeps what it did not write)."""
    path = followed(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = _new_sibling(path, label)
    try:
        yield temporary
        old = None
        if path.exists() and exchange(temporary, path):
            old = temporary
        else:
            if path.exists():
                old = path.parent / f".{path.name}.{label}-old.{uuid.uuid4().hex}.tmp"
                os.replace(path, old)
            os.replace(temporary, path)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    fsync_directory(path.parent)
    if old is not None:
        if retire is None:
            shutil.rmtree(old, ignore_errors=True)
        else:
            retire(old)


def _new_sibling(path: Path, label: str) -> Path:
    """A new empty directory `.<name>.<label>.<32 random hex>.tmp` beside `path`, made by
    `mkdir` (the umask decides its mode)."""
    while True:
        candidate = path.parent / f".{path.name}.{label}.{uuid.uuid4().hex}.tmp"
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate


# --- a command's output directory ------------------------------------------------------------


@contextmanager
def output_directory(
    path: str | Path, *, command: str, marker: str, sources: Iterable[str | Path] = ()
) -> Iterator[Path]:
    """Yield a staging directory that replaces the output `path` whole on success, after
    `refuse_unsafe_output` found nothing to lose there. The caller writes its files, then
    `write_output_marker` last: a later call finds that marker and may replace the directory.
    Held under `output_lock`, so a second writer of the same output waits."""
    target, sources = followed(path), list(sources)
    refuse_unsafe_output(path, command=command, marker=marker, sources=sources)
    with output_lock(target):  # the lock file is made beside an output that may be written
        refuse_unsafe_output(path, command=command, marker=marker, sources=sources)

        def retire(old: Path) -> None:
            retire_output(old, target, marker)

        with atomic_directory(target, OUTPUT_STAGING, retire) as staging:
            yield staging
            if not (staging / marker).is_file():
                raise RuntimeError(f"asyncrl {command} wrote no {marker} into {staging}")


def retire_output(old: Path, target: Path, marker: str) -> None:
    """Remove the output `old` that a new one replaced at `target`, if it holds only what its
    `marker` lists. Anything else in it (added while the new one was written: the check before
    could not see it) is the user's: the whole directory is kept, visibly, beside `target` as
    `<name>.previous-<random>`, and a warning says where."""
    listed = _listed(old / marker)
    unlisted = [child.name for child in old.iterdir() if child.name not in listed]
    if not unlisted:
        shutil.rmtree(old, ignore_errors=True)
        return
    kept = target.parent / f"{target.name}.{KEPT}-{uuid.uuid4().hex[:8]}"
    os.replace(old, kept)
    logger.warning(
        "%s held %s, which the output it replaced did not list (added while it was written?): "
        "that directory is kept whole at %s", target, _some(sorted(unlisted)), kept,
    )  # fmt: skip


def _listed(marker: Path) -> set[str]:
    """The names a marker lists as written (none for an unreadable marker, or one that lists
    nothing: then nothing may be removed as the command's)."""
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return set()
    names = recorded.get(OUTPUT_FILES) if isinstance(recorded, dict) else None
    if not isinstance(names, list):
        return set()
    return {name for name in names if isinstance(name, str)}


def write_output_marker(staging: Path, marker: str, description: dict[str, Any]) -> None:
    """The marker that makes `staging` a command's output: `description` and the names of
    every entry the command wrote (the marker's own included). Written last."""
    names = sorted({child.name for child in staging.iterdir()} | {marker})
    text = json.dumps({**description, OUTPUT_FILES: names}, indent=2)
    (staging / marker).write_text(text + "\n")


def refuse_unsafe_output(
    path: str | Path, *, command: str, marker: str, sources: Iterable[str | Path] = ()
) -> None:
    """Raise `OutputRefused` unless replacing `path` whole loses nothing: it must not be (or
    hold) any of `sources`, and must be missing, an empty directory, or an earlier output of
    `command` holding only what its `marker` lists (a marker of a version that listed nothing
    cannot tell the command's files from the user's: refused)."""
    target = followed(path)
    real = Path(os.path.realpath(target))
    for source in sources:
        if not os.path.lexists(source):  # a hub id, or nothing yet: nothing to lose
            continue
        source = Path(os.path.realpath(source))
        if real == source or real in source.parents:
            where = "is" if real == source else "holds"
            raise OutputRefused(
                f"output_dir {path} {where} what asyncrl {command} reads ({source}): writing "
                "it would remove that. Choose an output_dir outside it"
            )
    if not target.exists():
        return
    if not target.is_dir():
        raise OutputRefused(
            f"output_dir {path} is a file, not a directory: remove it or choose another path"
        )
    entries = sorted(child.name for child in target.iterdir())
    if not entries:
        return
    try:
        recorded = json.loads((target / marker).read_text())
    except (OSError, ValueError):
        recorded = None
    if not isinstance(recorded, dict):
        raise OutputRefused(
            f"output_dir {path} is not empty ({_some(entries)}) and is not an earlier output of "
            f"asyncrl {command} (no readable {marker} in it): writing it would remove what is "
            "there. Choose a new or empty directory, or remove this one yourself"
        )
    written = recorded.get(OUTPUT_FILES)
    if written is None:  # an earlier version's output: its marker lists no files
        raise OutputRefused(
            f"output_dir {path} was written by an earlier asyncrl {command}, whose {marker} "
            "does not list the files it wrote: what it wrote cannot be told from what was "
            f"added since ({_some(entries)}), and nothing is removed that no marker lists. "
            "Remove the directory yourself, or choose another output_dir"
        )
    if isinstance(written, list) and all(isinstance(name, str) for name in written):
        extra = [name for name in entries if name not in set(written)]
    else:
        raise OutputRefused(
            f"output_dir {path}: its {marker} lists `{OUTPUT_FILES}` as something other than "
            "file names: writing it would remove what is there. Remove it yourself first"
        )
    if extra:
        raise OutputRefused(
            f"output_dir {path} is an earlier output of asyncrl {command} but also holds "
            f"{_some(extra)}, which it did not write: writing it again would remove that. Move "
            "it out, or choose another output_dir"
        )


def _some(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


_lock_depths: dict[str, int] = {}
_thread_locks: dict[str, threading.RLock] = {}
_thread_locks_guard = threading.Lock()


@contextmanager
def output_lock(path: str | Path) -> Iterator[None]:
    """Hold `.<name>.lock` beside the output `path` (an advisory `flock`, which dies with its
    holder): two processes writing the same output take turns. The first holder in a process
    also removes what a killed earlier command left staged beside `path`, which nobody can be
    writing while the lock is held. Re-entrant within a thread (`get-model` holds it while
    `convert_gguf`, which takes it too, writes)."""
    target = followed(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_file = target.parent / f".{target.name}.lock"
    key = str(lock_file.resolve())
    with _thread_locks_guard:
        thread_lock = _thread_locks.setdefault(key, threading.RLock())
    with thread_lock:
        depth = _lock_depths.get(key, 0)
        _lock_depths[key] = depth + 1
        try:
            if depth:
                yield
            else:
                with lock_file.open("a") as handle:
                    fcntl.flock(handle, fcntl.LOCK_EX)
                    remove_output_leftovers(target)
                    yield
        finally:
            _lock_depths[key] = depth


def remove_output_leftovers(path: Path) -> None:
    """Delete the staging directories beside the output `path` that a killed `output_directory`
    left: `.<name>.asyncrl-output.<32 hex>.tmp` and its `-old`, names no user picks, and no
    other (what earlier versions staged under shorter names is left: it might be a user's).
    Only under `output_lock`."""
    name = re.escape(path.name)
    leftover = re.compile(rf"^\.{name}\.{OUTPUT_STAGING}(?:-old)?\.[0-9a-f]{{32}}\.tmp$")
    for child in path.parent.iterdir():
        if leftover.match(child.name) and child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)


# --- primitives ------------------------------------------------------------------------------

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
