"""The race's summary: time to the target with intervals, speed-ups, reward curves against
seconds and against completions, step rates, decompositions; and its plot."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from race_decomposition import PARTS
from race_stats import (
    band,
    bootstrap_mean,
    bootstrap_ratio,
    first_crossing,
    overlap_share,
)

SECONDS_GRID = 30.0
COMPLETIONS_GRID_STEPS = 4  # the per-sample curves are read every 4 steps' worth of completions


def curve(run: dict[str, Any], start: float, x: str, batch: int) -> list[tuple[float, float]]:
    """(seconds, completions trained or completions generated, sampled reward), starting from
    the SFT model. Generated counts the groups a contestant dropped too (TRL drops none)."""
    points = [(0.0, start)]
    for point in run["points"]:
        trained = point["step"] * batch
        where = {"seconds": point["seconds"], "completions": trained,
                 "generated": point.get("generated") or trained}[x]  # fmt: skip
        points.append((float(where), point["sampled"]))
    return points


def last(run: dict[str, Any], start: dict[str, float]) -> dict[str, float]:
    """A run's last scored snapshot; the start's scores if it took none within the budget."""
    return run["points"][-1] if run["points"] else start


def summarise(
    results: list[dict[str, Any]],
    start: dict[str, float],
    gain: float,
    batch: int,
    budget: float,
    png: Path,
) -> dict[str, Any]:
    target = start["sampled"] + gain
    systems = list(dict.fromkeys(r["system"] for r in results))
    runs = {s: [r for r in results if r["system"] == s] for s in systems}
    report: dict[str, Any] = {"target": round(target, 4), "systems": {}}
    to_target: dict[str, list[float]] = {}
    bands: dict[str, dict[str, list[dict[str, float]]]] = {}
    for system, mine in runs.items():
        seconds_curves = [curve(r, start["sampled"], "seconds", batch) for r in mine]
        completion_curves = [curve(r, start["sampled"], "completions", batch) for r in mine]
        generated_curves = [curve(r, start["sampled"], "generated", batch) for r in mine]
        crossings = [first_crossing(c, target) for c in seconds_curves]
        reached = [c for c in crossings if c is not None]
        to_target[system] = reached
        longest = min(c[-1][0] for c in seconds_curves)
        most = min(c[-1][0] for c in completion_curves)
        fewest = min(c[-1][0] for c in generated_curves)
        bands[system] = {
            "seconds": band(seconds_curves, grid(longest, SECONDS_GRID)),
            "completions": band(completion_curves, grid(most, COMPLETIONS_GRID_STEPS * batch)),
            "generated": band(generated_curves, grid(fewest, COMPLETIONS_GRID_STEPS * batch)),
        }
        summary: dict[str, Any] = {
            "seeds": len(mine),
            "reached_target": f"{len(reached)}/{len(mine)}",
            "seconds_to_target": [None if c is None else round(c, 1) for c in crossings],
            "steps_per_s": round(statistics.fmean(r["steps"] for r in mine) / budget, 4),
            "final_sampled": round(statistics.fmean(last(r, start)["sampled"] for r in mine), 4),
            "final_greedy": round(statistics.fmean(last(r, start)["greedy"] for r in mine), 4),
            "decomposition": {
                k: round(statistics.fmean(r["decomposition"].get(k, 0.0) for r in mine), 4)
                for k in ("step", *PARTS, "generation_overlapped", "snapshot")
            },
            "threads": mine[0]["threads"],
        }
        if reached:
            mean, low, high = bootstrap_mean(reached)
            summary["mean_seconds_to_target"] = [round(mean, 1), round(low, 1), round(high, 1)]
        report["systems"][system] = summary
    if to_target.get("trl"):
        report["speedup_to_target"] = {
            system: [round(v, 2) for v in bootstrap_ratio(to_target["trl"], reached)]
            for system, reached in to_target.items()
            if system != "trl" and reached
        }
    pairs = [(a, "trl") for a in bands if a != "trl"] + [("asyncrl", "asyncrl-onpolicy")]
    for per in ("completions", "generated"):
        report[f"curves_overlap_per_{per}"] = {
            f"{a} vs {b}": overlap_share(bands[a][per], bands[b][per])
            for a, b in pairs
            if a in bands and b in bands
        }
    report["sampled_at_completions"] = {  # learning per sample, read off the mean curves
        system: {per: [(row["x"], round(row["mean"], 3)) for row in curves[per]]
                 for per in ("completions", "generated")}
        for system, curves in bands.items()
    }  # fmt: skip
    if "asyncrl" in report["systems"] and "asyncrl-onpolicy" in report["systems"]:
        rates = report["systems"]
        report["steps_per_s_async_over_onpolicy"] = round(
            rates["asyncrl"]["steps_per_s"] / rates["asyncrl-onpolicy"]["steps_per_s"], 3
        )
    plot(bands, report, png)
    return report


def grid(end: float, every: float) -> list[float]:
    return [every * i for i in range(int(end // every) + 1)]


def plot(
    bands: dict[str, dict[str, list[dict[str, float]]]], report: dict[str, Any], png: Path
) -> None:
    figure, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for system, curves in bands.items():
        for axis, key in zip(axes[:2], ("seconds", "completions"), strict=True):
            rows = curves[key]
            xs = [row["x"] for row in rows]
            axis.plot(xs, [row["mean"] for row in rows], label=system)
            axis.fill_between(xs, [r["low"] for r in rows], [r["high"] for r in rows], alpha=0.2)
    for axis, label in zip(axes[:2], ("seconds since launch", "completions trained"), strict=True):
        axis.axhline(report["target"], color="grey", linestyle=":", label="target")
        axis.set_xlabel(label)
        axis.set_ylabel("held-out reward (T = 1)")
        axis.legend()
    systems = list(report["systems"])
    bottom = [0.0] * len(systems)
    for part in PARTS:
        heights = [report["systems"][s]["decomposition"][part] for s in systems]
        axes[2].bar(systems, heights, bottom=bottom, label=part)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    axes[2].set_ylabel("seconds per step")
    axes[2].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(png, dpi=110)
