"""The flake guard's judgement: slow against this run's own pace, not against the clock."""

from __future__ import annotations

import pytest
from tests.usual_durations import slower_than_usual


def test_a_test_far_behind_the_runs_pace_is_named_and_a_slow_machine_is_not() -> None:
    usual = {"a": 10.0, "b": 20.0, "c": 40.0, "d": 30.0, "tiny": 0.1}
    on_a_slower_machine = {"a": 15.0, "b": 30.0, "c": 60.0, "d": 45.0, "tiny": 5.0}
    pace, late = slower_than_usual(on_a_slower_machine, usual)
    assert pace == pytest.approx(1.5)
    assert late == []  # everything 1.5x slower: the machine, not a test
    stuck = on_a_slower_machine | {"b": 130.0}
    pace, late = slower_than_usual(stuck, usual)
    assert [test for test, _, _ in late] == ["b"]


def test_without_usual_times_nothing_is_judged() -> None:
    assert slower_than_usual({"a": 100.0}, {}) == (1.0, [])
