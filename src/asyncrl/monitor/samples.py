"""`<run dir>/samples/step_N.jsonl` (`run.layout.samples_file`): some of a batch's prompts,
completions and rewards as text, written by the orchestrator every `samples_interval` steps and
shown by the trackers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncrl.run.layout import samples_dir
from asyncrl.step_dirs import STEP_DIR


def sample_files(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, file) of every sample table written so far, ascending by step."""
    folder = samples_dir(run_dir)
    if not folder.exists():
        return []
    found = []
    for path in folder.glob("step_*.jsonl"):
        match = STEP_DIR.match(path.stem)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def read_samples(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
