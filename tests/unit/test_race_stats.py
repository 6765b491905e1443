"""The race's arithmetic against hand-computed values."""

from __future__ import annotations

import statistics

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
