"""A run in W&B and TensorBoard: the launcher follows `metrics.jsonl` and `samples/` and sends
what appears to each tracker in `report_to`.

The roles only write files, as always: one follower, in the launcher, makes one tracker run of
the whole `asyncrl rl` (roles told apart by their key prefixes: `trainer/`, `orchestrator/`,
`eval/`), with the resolved config attached. Records arrive out of step order (an evaluation
of step 2 ends after batch 4), so W&B plots everything against its own `step` key rather than
its internal counter, which would drop them. A tracker that fails (no network, a bad key, a
missing package) warns once and is dropped; the run goes on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from asyncrl.config.report import ReportConfig
from asyncrl.log import get_logger
from asyncrl.monitor.samples import read_samples, sample_files
from asyncrl.run.layout import metrics_file, tensorboard_dir

logger = get_logger(__name__)

SAMPLE_COLUMNS = ("env", "example_id", "prompt", "completion", "reward", "advantage")


class Tracker(Protocol):
    name: str

    def log(self, step: int, values: dict[str, float]) -> None: ...

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, log_dir: Path, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))
        self.writer.add_text("config", f"```\n{json.dumps(config, indent=2)}\n```", 0)

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        header = "| " + " | ".join(SAMPLE_COLUMNS) + " |\n|" + "---|" * len(SAMPLE_COLUMNS)
        lines = [
            "| " + " | ".join(_cell(row.get(column)) for column in SAMPLE_COLUMNS) + " |"
            for row in rows
        ]
        self.writer.add_text("samples", "\n".join([header, *lines]), step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    name = "wandb"

    def __init__(self, report: ReportConfig, run_dir: Path, config: dict[str, Any]) -> None:
        import wandb

        mode = "offline" if report.offline or os.environ.get("WANDB_MODE") == "offline" else None
        self.wandb = wandb
        self.run = wandb.init(
            project=report.project,
            name=report.name or run_dir.parent.name,
            dir=str(run_dir),
            config=config,
            mode=mode,
            job_type="rl",
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log({"step": step, **values})

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        table = self.wandb.Table(
            columns=list(SAMPLE_COLUMNS),
            data=[[row.get(c) for c in SAMPLE_COLUMNS] for row in rows],
        )
        self.run.log({"step": step, "samples": table})

    def close(self) -> None:
        self.run.finish()


class Reporter:
    """Follows a run directory and forwards each new record and sample table to the trackers."""

    def __init__(self, report: ReportConfig, run_dir: Path, config: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.metrics = metrics_file(run_dir)
        self.offset = 0  # bytes of metrics.jsonl already sent
        self.samples_sent: set[int] = set()
        self.trackers: list[Tracker] = []
        for name in report.trackers:
            try:
                self.trackers.append(_open(name, report, run_dir, config))
            except Exception as error:  # an optional extra or a service: never the run's end
                logger.warning("report_to: %s is off (%s: %s)", name, type(error).__name__, error)

    def refresh(self) -> None:
        """Send what was written since the last call: complete lines only (a role may be
        mid-write), then sample tables not sent yet."""
        if not self.trackers:
            return
        if self.metrics.exists():
            with self.metrics.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
            complete = data[: data.rfind(b"\n") + 1]
            self.offset += len(complete)
            for line in complete.splitlines():
                self._send_record(line)
        for step, path in sample_files(self.run_dir):
            if step not in self.samples_sent:
                self.samples_sent.add(step)
                self._each("log_samples", step, read_samples(path))

    def close(self) -> None:
        self.refresh()
        self._each("close")
        self.trackers.clear()

    def _send_record(self, line: bytes) -> None:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return  # a torn line from a crashed writer: `read_metrics` skips it too
        if "step" not in record:
            return  # a run header
        values = {
            key: value
            for key, value in record.items()
            if "/" in key and isinstance(value, int | float) and not isinstance(value, bool)
        }
        if values:
            self._each("log", int(record["step"]), values)

    def _each(self, method: str, *args: Any) -> None:
        for tracker in list(self.trackers):
            try:
                getattr(tracker, method)(*args)
            except Exception as error:  # no network, a full disk: warn once, go on without it
                logger.warning("report_to: %s failed and is off (%s)", tracker.name, error)
                self.trackers.remove(tracker)


def _open(name: str, report: ReportConfig, run_dir: Path, config: dict[str, Any]) -> Tracker:
    if name == "tensorboard":
        log_dir = (
            Path(report.tensorboard_dir) if report.tensorboard_dir else tensorboard_dir(run_dir)
        )
        return TensorBoardTracker(log_dir, config)
    return WandbTracker(report, run_dir, config)


def _cell(value: Any) -> str:
    text = f"{value:.4f}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", "⏎")
