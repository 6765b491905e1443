"""Find the orchestrator's run directory: a `run_*` child of the trainer's output_dir."""

from __future__ import annotations

import time
from pathlib import Path

from asyncrl.log import get_logger
from asyncrl.waiting import Wait

logger = get_logger(__name__)


def find_run_dir(output_dir: str | Path, timeout: float | None = None) -> Path:
    """Wait for `output_dir/run_*`; with several, take the most recently modified one."""
    root = Path(output_dir)
    wait = Wait(f"an orchestrator run directory {root}/run_*", logger, timeout)
    while True:
        runs = sorted(
            (p for p in root.glob("run_*") if p.is_dir()), key=lambda p: p.stat().st_mtime
        )
        if runs:
            if len(runs) > 1:
                logger.warning("several runs under %s; using the newest, %s", root, runs[-1].name)
            return runs[-1]
        wait.check()
        time.sleep(0.1)
