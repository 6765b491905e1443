"""Where checkpoints live, which are complete, and cleaning up the future before a resume.

Every role writes its part of step N to `<run_dir>/checkpoints/step_N/<role>/` atomically and
marks it COMPLETE last; a step is usable by a role when its own part is complete, and by a
whole run when every role's is. Resuming from step N removes what the crashed run produced
after N (batches, broadcasts, metrics records, the DONE marker), so that no step is repeated
or missing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from asyncrl.fs import atomic_write_bytes
from asyncrl.monitor.metrics import forget_metrics_after
from asyncrl.run.layout import CHECKPOINT_COMPLETE, checkpoints_dir, metrics_file
from asyncrl.step_dirs import remove_staging_leftovers, step_dirs, step_name
from asyncrl.transport.batches import forget_batches_after
from asyncrl.transport.broadcast import forget_broadcasts_after
from asyncrl.transport.run_end import clear_finished


def checkpoint_dir(run_dir: Path, step: int, role: str, root: Path | None = None) -> Path:
    return (root or checkpoints_dir(run_dir)) / step_name(step) / role


def complete_steps(run_dir: Path, roles: tuple[str, ...], root: Path | None = None) -> list[int]:
    """Steps whose parts for every role in `roles` are complete, ascending."""
    base = root or checkpoints_dir(run_dir)
    return [
        step
        for step, path in step_dirs(base)
        if all((path / role / CHECKPOINT_COMPLETE).exists() for role in roles)
    ]


def resolve_resume_step(
    requested: int | None, run_dir: Path, roles: tuple[str, ...], root: Path | None = None
) -> int | None:
    """None: start fresh; -1: the latest step complete for `roles`; N: step N (must exist)."""
    if requested is None:
        return None
    steps = complete_steps(run_dir, roles, root)
    if requested == -1:
        return steps[-1] if steps else None
    if requested not in steps:
        raise FileNotFoundError(
            f"no complete checkpoint for step {requested} under {root or checkpoints_dir(run_dir)}"
            f" (complete: {steps or 'none'})"
        )
    return requested


def mark_complete(directory: Path, step: int) -> None:
    atomic_write_bytes(directory / CHECKPOINT_COMPLETE, json.dumps({"step": step}).encode())


def prune(run_dir: Path, role: str, keep_last: int | None, keep_interval: int | None,
          root: Path | None = None) -> None:  # fmt: skip
    """Delete this role's older parts, keeping the newest `keep_last` and every
    `keep_interval`-th step."""
    if keep_last is None:
        return
    steps = complete_steps(run_dir, (role,), root)
    for step in steps[:-keep_last]:
        if keep_interval and step % keep_interval == 0:
            continue
        shutil.rmtree(checkpoint_dir(run_dir, step, role, root), ignore_errors=True)


def forget_after(run_dir: Path, step: int) -> None:
    """Before both roles resume from `step`: each owner removes what the crashed run produced
    after it (batches and DONE, broadcasts, metrics records, FINISHED), and half-written
    checkpoints go."""
    forget_batches_after(run_dir, step)
    forget_broadcasts_after(run_dir, step)
    forget_metrics_after(metrics_file(run_dir), step)
    clear_finished(run_dir)
    remove_staging_leftovers(checkpoints_dir(run_dir))
