"""The reporter follows metrics.jsonl as roles write it and survives a tracker that fails."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorboard", reason="the trackers extra is not installed (make trackers)")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from asyncrl.config.report import ReportConfig
from asyncrl.monitor.metrics import MetricsWriter
from asyncrl.monitor.trackers import Reporter


class BrokenTrackerStandIn:
    """Stands in for a tracker whose service went away: every call raises."""

    name = "broken"
    calls = 0

    def log(self, step: int, values: dict[str, float]) -> None:
        self.calls += 1
        raise ConnectionError("no network")

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        raise ConnectionError("no network")

    def close(self) -> None:
        pass


def scalars(log_dir: Path) -> dict[tuple[str, int], float]:
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {(t, e.step): e.value for t in events.Tags()["scalars"] for e in events.Scalars(t)}


def test_complete_lines_only_out_of_order_steps_and_a_failing_tracker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert ReportConfig.model_validate(["tensorboard"]).trackers == ["tensorboard"]
    reporter = Reporter(ReportConfig(trackers=["tensorboard"]), tmp_path, {"model": "m"})
    broken = BrokenTrackerStandIn()
    reporter.trackers.append(broken)
    MetricsWriter(tmp_path / "metrics.jsonl", "trainer").header({"recipe": "fp32"})
    MetricsWriter(tmp_path / "metrics.jsonl", "trainer").log(1, {"trainer/loss": 0.5})
    with (tmp_path / "metrics.jsonl").open("a") as handle:
        handle.write('{"role": "eval", "step": 0, "eval/x/mean@1": 0.2')  # mid-write
    with caplog.at_level(logging.WARNING):
        reporter.refresh()
        with (tmp_path / "metrics.jsonl").open("a") as handle:
            handle.write(', "label": "text"}\n')  # the line completes: only now is it sent
        reporter.refresh()
    reporter.close()
    assert broken.calls == 1  # dropped at its first failure
    assert sum("broken failed and is off" in r.message for r in caplog.records) == 1
    expected = {("trainer/loss", 1): 0.5, ("eval/x/mean@1", 0): 0.2}
    assert scalars(tmp_path / "tensorboard") == pytest.approx(expected)  # float32 on disk
