"""Find the orchestrator's run directory: a `run_*` child of the trainer's output_dir."""

from __future__ import annotations

import time
from pathlib import Path

from asyncrl.log import get_logger

logger = get_logger(__name__)


def find_run_dir(output_dir: str | Path, timeout: float | None = None) -> Path:
    """Wait for `output_dir/run_*`; with several, take the most recently modified one."""
    root = Path(output_dir)
    started = last_report = time.monotonic()
    while True:
        runs = sorted(
            (p for p in root.glob("run_*") if p.is_dir()), key=lambda p: p.stat().st_mtime
        )
        if runs:
            if len(runs) > 1:
                logger.warning("several runs under %s; using the newest, %s", root, runs[-1].name)
            return runs[-1]
        now = time.monotonic()
        if timeout is not None and now - started > timeout:
            raise TimeoutError(f"no orchestrator run directory (run_*) under {root}")
        if now - last_report > 30 or last_report == started:
            logger.info("waiting for an orchestrator run directory %s/run_*", root)
            last_report = now + 1e-9
        time.sleep(0.1)
