"""`asyncrl plot RUN_DIR -v reward -v kl -x step -o out.png|svg [-s --smooth-window N]`.

Reads `metrics.jsonl` (of a run directory, or the file itself) and draws one panel per
variable. A variable is a metric key, or a short name matched against the keys' last part
(`reward` → `orchestrator/reward_mean` before `orchestrator/reward/lcs_ratio`); an unknown name
lists what the file holds. x is `step`, `time` (seconds since the first record) or any key.
The panel of training reward also draws the run's held-out eval curves (`eval/<env>/mean@k`,
from `orchestrator.eval`), as points joined by lines, so the two can be read side by side.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from asyncrl.monitor.metrics import read_metrics
from asyncrl.run.layout import metrics_file


class PlotError(ValueError):
    pass


def resolve(name: str, keys: list[str]) -> str:
    if name in keys:
        return name
    candidates = [k for k in keys if k.split("/")[-1] == name or k.split("/")[-1] == f"{name}_mean"]
    candidates += [k for k in keys if name in k.split("/")[-1] and k not in candidates]
    if not candidates:
        raise PlotError(f"no metric matches `{name}`; available: {', '.join(sorted(keys))}")
    exact = (name, f"{name}_mean")
    return min(candidates, key=lambda k: (k.split("/")[-1] not in exact, len(k), k))


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out


TRAINING_REWARD = "orchestrator/reward_mean"
EVAL_CURVE = re.compile(r"^eval/[^/]+/mean@\d+$")


def series(
    records: list[dict[str, Any]], key: str, x: str, start: float
) -> tuple[list[float], list[float]]:
    """(xs, ys) of `key`, sorted by x, from the records that hold it."""
    points = []
    for record in records:
        if isinstance(record.get(key), int | float):
            position = record["time"] - start if x == "time" else record.get(x)
            if isinstance(position, int | float):
                points.append((position, record[key]))
    points.sort()
    return [p[0] for p in points], [p[1] for p in points]


def plot(
    source: Path, variables: list[str], x: str, output: Path, smooth: int | None = None
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = metrics_file(source) if source.is_dir() else source
    if not path.exists():
        raise PlotError(f"{path}: no metrics file")
    records = read_metrics(path)
    keys = sorted({k for r in records for k, v in r.items() if isinstance(v, int | float)})
    start = min((r["time"] for r in records), default=0.0)
    figure, axes = plt.subplots(len(variables), 1, figsize=(7, 2.6 * len(variables)), squeeze=False)
    for axis, name in zip(axes[:, 0], variables, strict=True):
        key = resolve(name, keys)
        xs, ys = series(records, key, x, start)
        axis.plot(xs, ys, alpha=0.35 if smooth else 1.0, label=key)
        if smooth:
            axis.plot(xs, moving_average(ys, smooth), label=f"{key} (mean of {smooth})")
        if key == TRAINING_REWARD:
            for eval_key in (k for k in keys if EVAL_CURVE.match(k)):
                axis.plot(*series(records, eval_key, x, start), marker="o", label=eval_key)
        axis.set_ylabel(name)
        axis.legend(fontsize=7)
        axis.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds" if x == "time" else x)
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output)
    plt.close(figure)
    return output


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="asyncrl plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="run directory or metrics.jsonl")
    parser.add_argument("-v", "--variable", action="append", required=True, dest="variables")
    parser.add_argument("-x", default="step", help="step, time, or a metric key")
    parser.add_argument("-o", "--output", type=Path, default=Path("metrics.png"))
    parser.add_argument("-s", "--smooth", action="store_true", help="add a moving average")
    parser.add_argument("--smooth-window", type=int, default=10)
    args = parser.parse_args(argv)
    try:
        out = plot(args.source, args.variables, args.x, args.output,
                   args.smooth_window if args.smooth else None)  # fmt: skip
    except (PlotError, ValueError) as error:
        print(f"asyncrl plot: {error}")
        return 2
    print(out)
    return 0
