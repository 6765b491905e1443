"""The race's arithmetic: when a run reached its target, intervals over seeds, curves on a
common grid, and each system's step decomposition. Pure functions, tested in
`tests/unit/test_race_stats.py`."""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Sequence

Point = tuple[float, float]  # (x: seconds or completions, reward)


def first_crossing(curve: Sequence[Point], target: float) -> float | None:
    """The x at which a curve first reaches `target`, interpolated linearly between the two
    snapshots around it (snapshots are tens of seconds apart); None if it never does."""
    points = sorted(curve)
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if y0 >= target:
            return x0
        if y1 >= target:
            return x0 + (x1 - x0) * (target - y0) / (y1 - y0)
    if points and points[-1][1] >= target:
        return points[-1][0]
    return None


def value_at(curve: Sequence[Point], x: float) -> float | None:
    """The curve at `x`, interpolated linearly; None outside the curve's range."""
    points = sorted(curve)
    if not points or x < points[0][0] or x > points[-1][0]:
        return None
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def bootstrap_mean(
    values: Sequence[float], resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean and a 95 % percentile-bootstrap interval over the values (one per seed)."""
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(resamples))
    return statistics.fmean(values), means[int(0.025 * resamples)], means[int(0.975 * resamples)]


def bootstrap_ratio(
    numerator: Sequence[float], denominator: Sequence[float], resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """mean(numerator) / mean(denominator) and a 95 % interval, the two systems' seeds
    resampled independently (they are separate runs)."""
    rng = random.Random(seed)
    ratios = sorted(
        statistics.fmean(rng.choices(numerator, k=len(numerator)))
        / statistics.fmean(rng.choices(denominator, k=len(denominator)))
        for _ in range(resamples)
    )
    point = statistics.fmean(numerator) / statistics.fmean(denominator)
    return point, ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples)]


def band(curves: Sequence[Sequence[Point]], grid: Sequence[float]) -> list[dict[str, float]]:
    """At each grid x that every curve covers: the mean over seeds and a 95 % bootstrap
    interval."""
    rows = []
    for x in grid:
        values = [value_at(curve, x) for curve in curves]
        if any(value is None for value in values):
            continue
        mean, low, high = bootstrap_mean([v for v in values if v is not None], 2000)
        rows.append({"x": x, "mean": mean, "low": low, "high": high})
    return rows


def overlap_share(first: list[dict[str, float]], second: list[dict[str, float]]) -> float | None:
    """The share of common grid points where the two bands' intervals overlap."""
    by_x = {row["x"]: row for row in second}
    common = [(row, by_x[row["x"]]) for row in first if row["x"] in by_x]
    if not common:
        return None
    overlapping = sum(1 for a, b in common if a["low"] <= b["high"] and b["low"] <= a["high"])
    return overlapping / len(common)


def mean_spans(steps: Sequence[dict[str, float]], skip: int = 5) -> dict[str, float]:
    """Per-step seconds of each part, averaged over the steps after the first `skip` (start-up
    and warm-up)."""
    kept = list(steps[skip:]) or list(steps)
    names = sorted({name for step in kept for name in step})
    return {name: statistics.fmean(step.get(name, 0.0) for step in kept) for name in names}
