"""`step_N` directories, the one naming rule of a run's rollouts, broadcasts and checkpoints,
and the cleaning every owner of such a folder does before a resume."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

STEP_DIR = re.compile(r"^step_(\d+)$")


def step_name(step: int) -> str:
    """The name of step `step`'s directory (`step_N`, what `STEP_DIR` matches)."""
    return f"step_{step}"


def step_of(path: Path) -> int | None:
    """N for a directory named `step_N`, else None."""
    match = STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


def step_dirs(folder: Path) -> list[tuple[int, Path]]:
    """(N, path) of every `step_N` directory in `folder`, ascending by N."""
    if not folder.exists():
        return []
    found = [(step, child) for child in folder.iterdir() if (step := step_of(child)) is not None]
    return sorted(found)


def remove_staging_leftovers(folder: Path) -> None:
    """Delete the hidden `.<name>….tmp` files and directories that atomic writes stage in and
    a crash can leave behind, in `folder` and in its step directories (checkpoints stage per
    role). Nothing under such a name is ever read."""
    if not folder.exists():
        return
    for place in [folder, *(path for _, path in step_dirs(folder))]:
        for child in place.iterdir():
            if child.name.startswith(".") and child.name.endswith(".tmp"):
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)


def remove_steps_after(folder: Path, step: int) -> None:
    """Delete `folder`'s step directories after `step` and whatever a crash left half-written."""
    for later, path in step_dirs(folder):
        if later > step:
            shutil.rmtree(path, ignore_errors=True)
    remove_staging_leftovers(folder)
