"""`metrics.jsonl`: one JSON object per step and role, appended and flushed line by line.

Besides step records, a role may write run-header records (`"kind": "header"`, no step): facts
fixed for the run, such as the precision a role chose and why. `read_metrics` returns the step
records and `read_headers` the headers, so readers of curves never meet a header.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from asyncrl.fs import atomic_write_bytes

HEADER = "header"


class MetricsWriter:
    """Appends `{"role", "step", "time", **metrics}` lines; a partial last line (a crash mid
    write) is the only damage a reader can meet, and `read_metrics` skips it with a warning."""

    def __init__(self, path: str | Path, role: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.role = role

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._append({"role": self.role, "step": step, "time": time.time()}, metrics)

    def header(self, facts: dict[str, Any]) -> None:
        """A run-header record: written once per process start, read by `read_headers`."""
        self._append({"role": self.role, "kind": HEADER, "time": time.time()}, facts)

    def _append(self, record: dict[str, Any], values: dict[str, Any]) -> None:
        record.update({key: _plain(value) for key, value in values.items()})
        line = (json.dumps(record) + "\n").encode()
        # one write(2) on an O_APPEND descriptor: roles appending at once never interleave; the
        # lock keeps a restarted role's rewrite (`forget_metrics_after`) from losing this line
        with _shared(self.path):
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(descriptor, line)
            finally:
                os.close(descriptor)


@contextmanager
def _locked(path: Path, kind: int) -> Iterator[None]:
    """`metrics.lock` beside the file: appends share it, a rewrite takes it alone."""
    with open(path.with_name("metrics.lock"), "a") as handle:
        fcntl.flock(handle, kind)
        yield


def _shared(path: Path) -> Any:
    return _locked(path, fcntl.LOCK_SH)


def _exclusive(path: Path) -> Any:
    return _locked(path, fcntl.LOCK_EX)


def _plain(value: Any) -> Any:
    """JSON has no NaN or inf: write them as null so every line stays valid JSON."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(path: str | Path, role: str | None = None) -> list[dict[str, Any]]:
    """All complete step records (optionally of one role); raises naming the file and line if
    a line other than the last is not valid JSON."""
    return [r for r in _read_records(path, role) if r.get("kind") != HEADER]


def read_headers(path: str | Path, role: str | None = None) -> list[dict[str, Any]]:
    """The run-header records (optionally of one role), oldest first: one per process start."""
    return [r for r in _read_records(path, role) if r.get("kind") == HEADER]


def _read_records(path: str | Path, role: str | None) -> list[dict[str, Any]]:
    path = Path(path)
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                break  # torn last line from a crash mid-write
            raise ValueError(f"{path}:{number}: not a JSON object ({error})") from error
        if role is None or record.get("role") == role:
            records.append(record)
    return records


class MetricsTail:
    """Follows `metrics.jsonl` as it grows, parsing each complete line once: the live view
    looks twice a second, and re-reading the whole file each time cost the launcher a parse
    of every record so far (quadratic over a run, on the cores the roles need). A file that
    was rewritten (a resume forgets records) is read again from its start."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self.identity: tuple[int, int] | None = None  # (device, inode) of the file read
        self.rewound = False  # the last call read a rewritten file from its start

    def new_records(self) -> list[dict[str, Any]]:
        """Records completed since the last call (headers and torn lines skipped)."""
        try:
            status = self.path.stat()
        except FileNotFoundError:
            return []
        identity = (status.st_dev, status.st_ino)
        self.rewound = self.identity is not None and (
            identity != self.identity or status.st_size < self.offset
        )
        if identity != self.identity or status.st_size < self.offset:
            self.identity, self.offset = identity, 0
        if status.st_size == self.offset:
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]  # a role may be mid-write
        self.offset += len(complete)
        records = []
        for line in complete.decode(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line from a crashed writer: `read_metrics` skips it too
            if isinstance(record, dict) and record.get("kind") != HEADER:
                records.append(record)
        return records


def forget_metrics_after(path: str | Path, step: int, role: str | None = None) -> None:
    """Before a resume from `step`: keep the headers and the records up to `step` (of `role`,
    or of every role); drop later ones and a torn line from the crash."""
    path = Path(path)
    if not path.exists():
        return
    with _exclusive(path):
        for leftover in path.parent.glob(f".{path.name}.*.tmp"):  # a rewrite killed midway
            leftover.unlink(missing_ok=True)
        kept = []
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("step", 0) <= step or (role is not None and record.get("role") != role):
                kept.append(line)
        atomic_write_bytes(path, ("\n".join(kept) + "\n" if kept else "").encode())
