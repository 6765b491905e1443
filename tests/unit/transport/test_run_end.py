"""The run-finished marker a colocated trainer serves until: it counts whenever it was written
(a trainer restarted after the orchestrator finished must stop), and a resume clears it."""

from __future__ import annotations

from pathlib import Path

from asyncrl.checkpoint.layout import forget_after
from asyncrl.transport.run_end import clear_finished, mark_finished, run_finished


def test_a_marker_written_before_the_trainer_restarted_still_ends_its_serving(
    tmp_path: Path,
) -> None:
    assert not run_finished(tmp_path)
    mark_finished(tmp_path, 8)
    assert run_finished(tmp_path)  # no "since": a later process sees it too
    clear_finished(tmp_path)  # what a (re)starting orchestrator does first
    assert not run_finished(tmp_path)


def test_a_resume_clears_the_marker_before_any_role_starts(tmp_path: Path) -> None:
    mark_finished(tmp_path, 8)
    forget_after(tmp_path, 8)
    assert not run_finished(tmp_path)
