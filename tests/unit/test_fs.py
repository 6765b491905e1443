from __future__ import annotations

import json
import os
import stat
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


def test_a_new_directory_gets_the_umask_mode_not_mkdtemps_0700(tmp_path: Path) -> None:
    """It was staged by `mkdtemp` (mode 0700) and renamed in as it was: a model exported for a
    group, or a broadcast read by a server under another user, was readable by its owner only."""
    previous = os.umask(0o022)
    try:
        with atomic_directory(tmp_path / "model") as staging:
            (staging / "weights").write_text("v1")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == 0o755


@pytest.mark.parametrize("target_exists", [True, False])
def test_a_symlinked_directory_is_written_through_and_the_link_kept(
    target_exists: bool, tmp_path: Path
) -> None:
    """The link itself was exchanged for the new directory: `models/current -> /data/run7`
    became a real directory, and /data/run7 was left as it was."""
    real = tmp_path / "data" / "model"
    if target_exists:
        real.mkdir(parents=True)
        (real / "weights").write_text("v1")
    link = tmp_path / "current"
    link.symlink_to(real, target_is_directory=True)
    with atomic_directory(link) as staging:
        (staging / "weights").write_text("v2")
    assert link.is_symlink() and Path(os.readlink(link)) == real
    assert (real / "weights").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "data"]
    assert [p.name for p in real.parent.iterdir()] == ["model"]


def output(path: Path, **marker: object) -> None:
    with fs.output_directory(path, command="tool", marker="TOOL", sources=()) as staging:
        (staging / "weights").write_text("new")
        fs.write_output_marker(staging, "TOOL", dict(marker))


def test_an_output_directory_replaces_only_its_own_earlier_output(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"
    output(target, made=1)  # missing: made
    output(target, made=2)  # its own: replaced
    written = json.loads((target / "TOOL").read_text())
    assert written == {"made": 2, fs.OUTPUT_FILES: ["TOOL", "weights"]}
    (target / "notes.txt").write_text("mine")
    with pytest.raises(fs.OutputRefused, match=r"also holds notes\.txt, which it did not write"):
        output(target)
    other = tmp_path / "models" / "other"
    other.mkdir()
    (other / "weights").write_text("someone else's")
    with pytest.raises(fs.OutputRefused, match=r"not an earlier output of asyncrl tool"):
        output(other)
    with pytest.raises(fs.OutputRefused, match=r"is not an earlier output"):
        output(tmp_path / "models")  # above both
    assert (target / "notes.txt").read_text() == "mine"
    assert (other / "weights").read_text() == "someone else's"
    (tmp_path / "empty").mkdir()
    output(tmp_path / "empty")  # an empty directory loses nothing
    (tmp_path / "file").write_text("x")
    with pytest.raises(fs.OutputRefused, match=r"is a file, not a directory"):
        output(tmp_path / "file")


def test_an_output_at_or_above_what_the_command_reads_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "out" / "run_default" / "broadcasts" / "step_2"
    source.mkdir(parents=True)
    for place in (source, source.parent, tmp_path / "out", tmp_path):
        with pytest.raises(fs.OutputRefused, match=r"(is|holds) what asyncrl tool reads"):
            fs.refuse_unsafe_output(place, command="tool", marker="TOOL", sources=[source])
    fs.refuse_unsafe_output(tmp_path / "elsewhere", command="tool", marker="TOOL",
                            sources=[source, "org/hub-model"])  # fmt: skip


def test_what_a_killed_output_write_left_is_removed_at_the_next_start(tmp_path: Path) -> None:
    """Only names no user picks go. The cleaning used to take `.<name>.<any 8 of a-z0-9_>.tmp`
    too (what versions before staged under), and with it a user's `.m.backup_1.tmp` (issue 86)."""
    target = tmp_path / "m"
    random = "0123456789abcdef" * 2
    leftovers = [f".m.asyncrl-output.{random}.tmp", f".m.asyncrl-output-old.{random}.tmp"]
    users = [".m.backup_1.tmp", ".m.x1_y2z3q.tmp", ".m.old.89abcdef.tmp", ".m.output.0123abcd.tmp"]
    kept = [*users, f".m.staging.{random}.tmp", f".mm.asyncrl-output.{random}.tmp",
            f"m.asyncrl-output.{random}.tmp", ".m.asyncrl-output.0123abcd.tmp"]  # fmt: skip
    for name in leftovers + kept:
        (tmp_path / name).mkdir()
        (tmp_path / name / "half").write_text("x")
    output(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".m.lock", "m", *kept])


def test_an_earlier_versions_output_whose_marker_lists_nothing_is_never_replaced(
    tmp_path: Path,
) -> None:
    """Before markers listed their files, a marker said only that the command wrote the
    directory. A `config.json` the user put there later looked like one such an output holds,
    and was deleted with it (issue 86): nothing is removed that no marker lists."""
    target = tmp_path / "m"
    target.mkdir()
    (target / "TOOL").write_text(json.dumps({"source": "x"}))  # no `output_files`
    (target / "model.safetensors").write_text("old")
    (target / "config.json").write_text('{"the user": "wrote this later"}')
    with pytest.raises(fs.OutputRefused, match=r"does not list the files it wrote"):
        output(target)
    assert (target / "config.json").read_text() == '{"the user": "wrote this later"}'
    (target / "TOOL").write_text(json.dumps({fs.OUTPUT_FILES: "weights"}))  # not a list
    with pytest.raises(fs.OutputRefused, match="as something other than file names"):
        output(target)


@pytest.mark.parametrize("earlier", [True, False])
def test_what_is_added_to_an_output_while_it_is_written_is_kept(
    tmp_path: Path, earlier: bool
) -> None:
    """The check runs before the (long) export; the folder it replaces used to be removed
    whole afterwards, with whatever the user had put in it meanwhile (issue 86)."""
    target = tmp_path / "m"
    if earlier:
        output(target, made=1)  # its own earlier output, which it may replace
    with fs.output_directory(target, command="tool", marker="TOOL") as staging:
        (staging / "weights").write_text("new")
        fs.write_output_marker(staging, "TOOL", {"made": 2})
        target.mkdir(exist_ok=True)
        (target / "notes.txt").write_text("written during the export")
    assert (target / "weights").read_text() == "new"
    (kept,) = [p for p in tmp_path.iterdir() if p.name.startswith("m.previous-")]
    assert (kept / "notes.txt").read_text() == "written during the export"
    assert sorted(p.name for p in kept.iterdir()) == (
        ["TOOL", "notes.txt", "weights"] if earlier else ["notes.txt"]
    )
    output(target, made=3)  # an output with nothing added: replaced, nothing kept
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("m.previous-")] == [kept.name]
