"""The combined live view of a run: step, reward, tied groups, entropy, throughput, staleness,
ETA — read from `metrics.jsonl`, drawn with rich on a terminal and as one log line per step
otherwise."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from rich.live import Live
from rich.table import Table

from asyncrl.log import console, get_logger
from asyncrl.monitor.metrics import MetricsTail

logger = get_logger(__name__)


class LiveView:
    def __init__(self, metrics_path: Path, max_steps: int | None) -> None:
        self.path = metrics_path
        self.max_steps = max_steps
        self.started = time.monotonic()
        self.shown_step = 0
        self.tail = MetricsTail(metrics_path)
        self.newest: dict[str, dict[str, Any]] = {}  # role -> its newest record
        self.live: Live | None = (
            Live(console=console, refresh_per_second=2) if sys.stderr.isatty() else None
        )

    def __enter__(self) -> LiveView:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def latest(self) -> tuple[dict[str, Any], dict[str, Any]]:
        records = self.tail.new_records()
        if self.tail.rewound:  # a resume forgot records: start over from what is left
            self.newest.clear()
        for record in records:
            self.newest[str(record.get("role"))] = record
        return self.newest.get("orchestrator", {}), self.newest.get("trainer", {})

    def refresh(self) -> None:
        orch, train = self.latest()
        step = train.get("step", 0)
        elapsed = time.monotonic() - self.started
        eta = (
            f"{elapsed / step * (self.max_steps - step):.0f} s"
            if step and self.max_steps else "?"
        )  # fmt: skip
        row = {
            "step": f"{step}/{self.max_steps or '∞'} (batches {orch.get('step', 0)})",
            "reward": _fmt(orch.get("orchestrator/reward_mean")),
            # the share of groups that scored alike (no signal), and the sampler's entropy: both
            # near their ends (1 and 0) for long is a collapsed policy (docs/training.md)
            "tied": _fmt(orch.get("orchestrator/zero_advantage_groups"), "{:.2f}"),
            "entropy": _fmt(orch.get("orchestrator/sampled_entropy"), "{:.3f}"),
            "gen tok/s": _fmt(orch.get("orchestrator/tokens_per_s"), "{:,.0f}"),
            "train tok/s": _fmt(train.get("trainer/tokens_per_s"), "{:,.0f}"),
            "staleness": _fmt(train.get("trainer/max_staleness"), "{:.0f}"),
            "mismatch kl": _fmt(train.get("trainer/mismatch_kl"), "{:.1e}"),
            "eta": eta,
        }
        if self.live is not None:
            table = Table(*row.keys(), title="asyncrl rl")
            table.add_row(*row.values())
            self.live.update(table)
        elif step > self.shown_step:
            self.shown_step = step
            logger.info("rl: " + "  ".join(f"{k} {v}" for k, v in row.items()))


def _fmt(value: object, pattern: str = "{:.3f}") -> str:
    return pattern.format(value) if isinstance(value, int | float) else "-"
