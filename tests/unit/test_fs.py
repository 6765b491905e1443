from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl import fs
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


@pytest.mark.parametrize("can_exchange", [True, False])
def test_replacing_a_directory_swaps_it_whole_and_leaves_nothing_behind(
    can_exchange: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to delete the old directory, then rename the new one in: a window with no
    directory at all, and a crash in it lost both."""
    exchanged: list[bool] = []
    real_exchange = fs.exchange

    def exchange(first: Path, second: Path) -> bool:
        exchanged.append(can_exchange and real_exchange(first, second))
        return exchanged[-1]

    monkeypatch.setattr(fs, "exchange", exchange)
    target = tmp_path / "step_3"
    with atomic_directory(target) as staging:
        (staging / "weights").write_text("v1")
    assert exchanged == []  # nothing to swap with
    with atomic_directory(target) as staging:
        (staging / "weights").write_text("v2")
        (staging / "STABLE").write_text("{}")
    assert exchanged == [can_exchange]
    assert sorted(p.name for p in target.iterdir()) == ["STABLE", "weights"]
    assert (target / "weights").read_text() == "v2"
    assert [p.name for p in tmp_path.iterdir()] == ["step_3"]


def test_exchange_swaps_two_directories(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "from_a").touch()
    if not fs.exchange(first, second):
        pytest.skip("this filesystem or C library cannot exchange (the fallback renames aside)")
    assert [p.name for p in second.iterdir()] == ["from_a"] and not any(first.iterdir())
