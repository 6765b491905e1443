from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.fs import atomic_directory, atomic_write_bytes


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "file.bin"
    atomic_write_bytes(target, b"first")
    atomic_write_bytes(target, b"second")
    assert target.read_bytes() == b"second"
    assert [p.name for p in target.parent.iterdir()] == ["file.bin"]


def test_failed_directory_write_keeps_the_old_one(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    with atomic_directory(target) as staging:
        (staging / "weights").write_text("v1")
    with pytest.raises(RuntimeError), atomic_directory(target) as staging:
        (staging / "weights").write_text("v2-half")
        raise RuntimeError("crash mid-save")
    assert (target / "weights").read_text() == "v1"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
