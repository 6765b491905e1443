"""The eval summary by hand, and which steps a run evaluates after a resume."""

from __future__ import annotations

import pytest

from asyncrl.config.orchestrator import EvalConfig
from asyncrl.monitor.eval_records import summarize
from asyncrl.orchestrator.online_eval import OnlineEval


def summary(results: list[list[tuple[float, list[int]]]], threshold: float = 1.0) -> dict:
    return summarize("sums", results, threshold, launch_version=4)


def test_mean_best_and_pass_at_k_by_hand() -> None:
    results = [
        [(1.0, [4, 4]), (0.0, [4, 5])],  # solved by one of two
        [(0.5, [5]), (0.25, [5, 5])],  # best 0.5: not solved
        [(0.0, []), (0.0, [])],  # empty completions: no tokens, no versions
    ]
    got = summary(results)
    assert got["eval/sums/mean@2"] == pytest.approx((1.0 + 0.0 + 0.5 + 0.25) / 6)
    assert got["eval/sums/best@2"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert got["eval/sums/pass@2"] == pytest.approx(1 / 3)
    assert (got["eval/sums/version"], got["eval/sums/version_max"]) == (4, 5)  # it moved on
    assert summary(results, threshold=0.5)["eval/sums/pass@2"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("resumed_at", "base", "skip", "expected"),
    [(0, True, True, 0), (0, False, True, 10), (10, True, True, 20), (10, True, False, 10),
     (13, True, True, 20)],
)  # fmt: skip
def test_first_step_after_a_start_or_a_resume(
    resumed_at: int, base: bool, skip: bool, expected: int
) -> None:
    config = EvalConfig(interval=10, eval_base_model=base, skip_eval_on_resume=skip)
    assert OnlineEval.first_step(config, resumed_at) == expected
