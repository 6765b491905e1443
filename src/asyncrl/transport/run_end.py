"""`FINISHED` in the run directory: the orchestrator is done with the inference servers (final
weights loaded, last evaluation answered). A colocated trainer, which hosts the server, keeps
serving after its last step until it appears.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from asyncrl.fs import atomic_write_bytes
from asyncrl.run.layout import finished_marker


def mark_finished(run_dir: Path, step: int) -> None:
    payload = {"step": step, "time": time.time()}
    atomic_write_bytes(finished_marker(run_dir), json.dumps(payload).encode())


def clear_finished(run_dir: Path) -> None:
    """At start-up: a marker left by an earlier run says nothing about this one."""
    finished_marker(run_dir).unlink(missing_ok=True)


def run_finished(run_dir: Path) -> bool:
    """Whether the orchestrator has finished the run. A marker from an earlier run in the same
    directory never misleads: the orchestrator clears it when it starts (before any batch the
    trainer could finish on), and a resume clears it before any role starts. A trainer
    restarted after the orchestrator finished sees it and stops at once."""
    return finished_marker(run_dir).exists()
