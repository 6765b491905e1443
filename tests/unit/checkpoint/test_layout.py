from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.checkpoint.layout import (
    checkpoint_dir,
    complete_steps,
    forget_after,
    mark_complete,
    prune,
    resolve_resume_step,
)


def make(run: Path, step: int, role: str, complete: bool = True) -> None:
    directory = checkpoint_dir(run, step, role)
    directory.mkdir(parents=True)
    if complete:
        mark_complete(directory, step)


def test_resume_step_is_the_latest_complete_for_every_role(tmp_path: Path) -> None:
    make(tmp_path, 2, "trainer")
    make(tmp_path, 2, "orchestrator")
    make(tmp_path, 4, "trainer")
    make(tmp_path, 4, "orchestrator", complete=False)  # crashed mid-save
    roles = ("trainer", "orchestrator")
    assert complete_steps(tmp_path, roles) == [2]
    assert resolve_resume_step(-1, tmp_path, roles) == 2
    assert resolve_resume_step(-1, tmp_path, ("trainer",)) == 4
    assert resolve_resume_step(None, tmp_path, roles) is None
    with pytest.raises(FileNotFoundError, match="no complete checkpoint for step 4"):
        resolve_resume_step(4, tmp_path, roles)
    assert resolve_resume_step(-1, tmp_path / "fresh", roles) is None


def test_prune_keeps_the_last_and_the_interval(tmp_path: Path) -> None:
    for step in range(1, 9):
        make(tmp_path, step, "trainer")
    prune(tmp_path, "trainer", keep_last=2, keep_interval=3)
    assert complete_steps(tmp_path, ("trainer",)) == [3, 6, 7, 8]


def test_forget_after_removes_the_lost_future(tmp_path: Path) -> None:
    for kind in ("rollouts", "broadcasts"):
        for step in (1, 2, 3):
            (tmp_path / kind / f"step_{step}").mkdir(parents=True)
    (tmp_path / "rollouts" / "DONE").touch()
    lines = [json.dumps({"role": "trainer", "step": s}) for s in (1, 2, 3)] + ['{"torn']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    forget_after(tmp_path, 2)
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["step_1", "step_2"]
    assert sorted(p.name for p in (tmp_path / "broadcasts").iterdir()) == ["step_1", "step_2"]
    text = (tmp_path / "metrics.jsonl").read_text()
    steps = [json.loads(line)["step"] for line in text.splitlines()]
    assert steps == [1, 2]


def test_forget_after_removes_what_a_crash_left_half_written(tmp_path: Path) -> None:
    """A SIGKILL mid-write leaves atomic writes' staging names behind; resuming clears them."""
    staged = [
        tmp_path / "broadcasts" / ".step_5.wqn9sn2f.tmp",  # a broadcast being written
        tmp_path / "rollouts" / ".step_6.x1.tmp",
        tmp_path / "checkpoints" / "step_6" / ".trainer.tmp",  # a checkpoint being written
    ]
    for path in staged:
        (path / "shards").mkdir(parents=True)
    stray_file = tmp_path / "rollouts" / "step_2" / ".batch.msgpack.abc.tmp"
    stray_file.parent.mkdir(parents=True)
    stray_file.write_bytes(b"half")
    kept = tmp_path / "checkpoints" / "step_2" / "trainer" / "shards" / ".metadata"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"DCP index")
    forget_after(tmp_path, 2)
    assert not [path for path in (*staged, stray_file) if path.exists()]
    assert kept.exists()  # a real file whose name starts with a dot
