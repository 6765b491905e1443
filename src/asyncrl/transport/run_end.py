"""`FINISHED` in the run directory: the orchestrator is done with the inference servers (final
weights loaded, last evaluation answered). A colocated trainer, which hosts the server, keeps
serving after its last step until it appears.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from asyncrl.fs import atomic_write_bytes

FINISHED = "FINISHED"


def mark_finished(run_dir: Path, step: int) -> None:
    payload = {"step": step, "time": time.time()}
    atomic_write_bytes(run_dir / FINISHED, json.dumps(payload).encode())


def clear_finished(run_dir: Path) -> None:
    """At start-up: a marker left by an earlier run says nothing about this one."""
    (run_dir / FINISHED).unlink(missing_ok=True)


def finished_since(run_dir: Path, since: float) -> bool:
    """Whether the orchestrator finished after `since` (a time.time())."""
    try:
        return float(json.loads((run_dir / FINISHED).read_text())["time"]) >= since
    except (OSError, ValueError, KeyError, TypeError):
        return False  # absent, or from a run this one does not know
