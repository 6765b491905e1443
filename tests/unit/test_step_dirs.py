"""`step_N` directories: found in numeric order, other names ignored, later ones removed."""

from __future__ import annotations

from pathlib import Path

from asyncrl.step_dirs import remove_steps_after, step_dirs, step_of


def test_step_directories_sort_by_number_and_ignore_other_names(tmp_path: Path) -> None:
    for name in ("step_10", "step_9", "step_x", "my_step_3", ".step_4.tmp", "DONE"):
        (tmp_path / name).mkdir()
    assert [step for step, _ in step_dirs(tmp_path)] == [9, 10]
    assert step_of(tmp_path / "step_12") == 12 and step_of(tmp_path / "step_12b") is None
    assert step_dirs(tmp_path / "missing") == []


def test_removing_steps_after_keeps_the_past_and_drops_staging(tmp_path: Path) -> None:
    for name in ("step_1", "step_2", "step_3", ".step_3.abc.tmp"):
        (tmp_path / name).mkdir()
    (tmp_path / "step_2" / ".weights.tmp").write_text("half")
    remove_steps_after(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1", "step_2"]
    assert list((tmp_path / "step_2").iterdir()) == []
