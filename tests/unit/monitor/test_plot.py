from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.monitor.metrics import MetricsWriter
from asyncrl.monitor.plot import PlotError, main, moving_average, plot, resolve

KEYS = [
    "orchestrator/env/reverse-text/reward_mean",
    "orchestrator/reward/lcs_ratio",
    "orchestrator/reward_mean",
    "trainer/mismatch_kl",
]


def test_short_names_resolve_to_the_plainest_key() -> None:
    assert resolve("reward", KEYS) == "orchestrator/reward_mean"
    assert resolve("kl", KEYS) == "trainer/mismatch_kl"
    assert resolve("trainer/mismatch_kl", KEYS) == "trainer/mismatch_kl"
    with pytest.raises(PlotError, match="no metric matches `entropy`; available"):
        resolve("entropy", KEYS)


def test_moving_average_hand_worked() -> None:
    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_plot_writes_the_file(tmp_path: Path, suffix: str) -> None:
    for step in range(1, 6):
        MetricsWriter(tmp_path / "metrics.jsonl", "orchestrator").log(
            step, {"orchestrator/reward_mean": step / 10}
        )
        MetricsWriter(tmp_path / "metrics.jsonl", "trainer").log(step, {"trainer/mismatch_kl": 0.1})
    out = plot(tmp_path, ["reward", "kl"], "step", tmp_path / f"out.{suffix}", smooth=2)
    assert out.stat().st_size > 1000
    assert main([str(tmp_path), "-v", "reward", "-x", "time", "-o", str(tmp_path / "t.png")]) == 0
    assert main([str(tmp_path), "-v", "nope", "-o", str(tmp_path / "n.png")]) == 2


def test_the_reward_panel_draws_the_eval_curves_beside_it(tmp_path: Path) -> None:
    for step in range(1, 7):
        MetricsWriter(tmp_path / "metrics.jsonl", "orchestrator").log(
            step, {"orchestrator/reward_mean": step / 10}
        )
    for step in (0, 3, 6):
        MetricsWriter(tmp_path / "metrics.jsonl", "eval").log(
            step, {"eval/reverse-text/mean@2": 0.2 + step / 20, "eval/reverse-text/pass@2": 0.0}
        )
    svg = plot(tmp_path, ["reward"], "step", tmp_path / "out.svg").read_text()
    assert "eval/reverse-text/mean@2" in svg  # its legend entry (matplotlib names text in SVG)
    assert "eval/reverse-text/pass@2" not in svg  # one curve per env: the mean
    bare = plot(tmp_path, ["pass@2"], "step", tmp_path / "bare.svg").read_text()
    assert "eval/reverse-text/mean@2" not in bare  # only the training-reward panel has them
