"""The race's arithmetic against hand-computed values."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from benchmarks.race_stats import (
    band,
    bootstrap_mean,
    bootstrap_ratio,
    first_crossing,
    mean_spans,
    overlap_share,
    value_at,
)


def test_the_crossing_is_interpolated_between_the_snapshots_around_it() -> None:
    curve = [(0.0, 0.50), (60.0, 0.56), (120.0, 0.64)]
    assert first_crossing(curve, 0.60) == pytest.approx(90.0)  # halfway from 0.56 to 0.64
    assert first_crossing(curve, 0.50) == 0.0
    assert first_crossing(curve, 0.70) is None  # never reached: censored, not invented
    assert value_at(curve, 30.0) == pytest.approx(0.53)
    assert value_at(curve, 200.0) is None


def test_bootstrap_intervals_contain_the_mean_and_shrink_to_it_without_spread() -> None:
    values = [10.0, 12.0, 11.0, 13.0, 9.0]
    mean, low, high = bootstrap_mean(values)
    assert mean == statistics.fmean(values)
    assert low < mean < high
    assert bootstrap_mean([5.0] * 5) == (5.0, 5.0, 5.0)
    ratio, low, high = bootstrap_ratio([400.0] * 5, [200.0] * 5)
    assert (ratio, low, high) == (2.0, 2.0, 2.0)


def test_bands_cover_only_the_common_range_and_overlap_is_counted() -> None:
    a = [[(0.0, 0.5), (100.0, 0.7)], [(0.0, 0.5), (80.0, 0.7)]]
    rows = band(a, [0.0, 50.0, 90.0])
    assert [row["x"] for row in rows] == [0.0, 50.0]  # 90 is past the second curve
    far = band([[(0.0, 0.9), (100.0, 0.9)]] * 2, [0.0, 50.0])
    assert overlap_share(rows, rows) == 1.0
    assert overlap_share(rows, far) == 0.0


def test_spans_skip_the_warm_up_steps() -> None:
    steps = [{"train": 9.0}] * 5 + [{"train": 1.0, "generate": 2.0}, {"train": 3.0}]
    assert mean_spans(steps) == {"generate": 1.0, "train": 2.0}


def test_completions_generated_count_the_groups_a_contestant_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from race_decomposition import generated_by_step  # the scripts import each other by name
    from race_report import curve

    metrics = tmp_path / "metrics.jsonl"
    rows = [
        {"role": "orchestrator", "step": 1, "orchestrator/dropped/no_signal": 3},
        {"role": "trainer", "step": 1, "orchestrator/dropped/no_signal": 99},  # not the server's
        {"role": "orchestrator", "step": 2},
        {"role": "orchestrator", "step": 3, "orchestrator/dropped/no_signal": 1,
         "orchestrator/dropped/off_policy": 2},
    ]  # fmt: skip
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    counts = generated_by_step(metrics, batch=32, group=8)
    assert counts == {1: 32 + 24, 2: 56 + 32, 3: 88 + 32 + 24}
    run = {"points": [{"step": 3, "seconds": 9.0, "sampled": 0.4, "generated": counts[3]}]}
    assert curve(run, 0.1, "completions", 32) == [(0.0, 0.1), (96.0, 0.4)]
    assert curve(run, 0.1, "generated", 32) == [(0.0, 0.1), (144.0, 0.4)]
    trl = {"points": [{"step": 3, "seconds": 9.0, "sampled": 0.4}]}  # drops nothing
    assert curve(trl, 0.1, "generated", 32) == [(0.0, 0.1), (96.0, 0.4)]
