"""Where checkpoints live, which are complete, and cleaning up the future before a resume.

Every role writes its part of step N to `<run_dir>/checkpoints/step_N/<role>/` atomically and
marks it COMPLETE last; a step is usable by a role when its own part is complete, and by a
whole run when every role's is. Resuming from step N removes what the crashed run produced
after N (batches, broadcasts, metrics records, the DONE marker), so that no step is repeated
or missing.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from asyncrl.fs import atomic_write_bytes

COMPLETE = "COMPLETE"
STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir(run_dir: Path, step: int, role: str, root: Path | None = None) -> Path:
    return (root or run_dir / "checkpoints") / f"step_{step}" / role


def complete_steps(run_dir: Path, roles: tuple[str, ...], root: Path | None = None) -> list[int]:
    """Steps whose parts for every role in `roles` are complete, ascending."""
    base = root or run_dir / "checkpoints"
    if not base.exists():
        return []
    steps = []
    for child in base.iterdir():
        match = STEP_DIR.match(child.name)
        if match and all((child / role / COMPLETE).exists() for role in roles):
            steps.append(int(match.group(1)))
    return sorted(steps)


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
            f"no complete checkpoint for step {requested} under {root or run_dir / 'checkpoints'}"
            f" (complete: {steps or 'none'})"
        )
    return requested


def mark_complete(directory: Path, step: int) -> None:
    atomic_write_bytes(directory / COMPLETE, json.dumps({"step": step}).encode())


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


def remove_staging_leftovers(folder: Path) -> None:
    """Delete the hidden `.<name>….tmp` files and directories that atomic writes stage in and
    a crash can leave behind, in `folder` and in its step directories (checkpoints stage per
    role). Nothing under such a name is ever read."""
    if not folder.exists():
        return
    places = [folder, *(child for child in folder.iterdir() if STEP_DIR.match(child.name))]
    for place in places:
        for child in place.iterdir():
            if child.name.startswith(".") and child.name.endswith(".tmp"):
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)


def forget_after(run_dir: Path, step: int) -> None:
    """Remove what a crashed run produced after `step`, before resuming from it."""
    for kind in ("rollouts", "broadcasts"):
        folder = run_dir / kind
        if folder.exists():
            for child in folder.iterdir():
                match = STEP_DIR.match(child.name)
                if match and int(match.group(1)) > step:
                    shutil.rmtree(child, ignore_errors=True)
    for folder in (run_dir / "rollouts", run_dir / "broadcasts", run_dir / "checkpoints"):
        remove_staging_leftovers(folder)
    (run_dir / "rollouts" / "DONE").unlink(missing_ok=True)
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        kept = []
        for line in metrics.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except json.JSONDecodeError:
                continue  # a torn line from the crash
        atomic_write_bytes(metrics, ("\n".join(kept) + "\n" if kept else "").encode())
