"""The own-data example (examples/own_data, docs/own-data.md) as its page runs it: `asyncrl
score` shows the reward reading the data's extra column in the isolated reward workers, then
`asyncrl rl` trains on the data with the user's reward module (on the tiny model here, for
time; the page's model is SmolLM2) and scores the held-out file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.launch.inference_process import free_port
from asyncrl.monitor.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "own_data"


def asyncrl(*args: str) -> str:
    """A command of the page, from the repository root, with the example's folder on PYTHONPATH."""
    python_path = os.pathsep.join([str(EXAMPLE), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", *args], capture_output=True, text=True,
        timeout=900, cwd=REPO, env={**os.environ, "PYTHONPATH": python_path},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_score_shows_the_reward_reading_the_unit_column() -> None:
    shown = asyncrl("score", "examples/own_data/score.yaml")
    rewards = re.findall(r"reward (\d\.\d{3}) \(score [\d.]+\) ← '([^']*)'", shown)
    units = re.findall(r'"unit": "(\w+)"', shown)
    assert len(units) == 2 and len(rewards) == 6, shown
    per_example = [rewards[i : i + 3] for i in range(0, len(rewards), 3)]
    for unit, (right, alone, wrong) in zip(units, per_example, strict=True):
        # the same right number earns 1 with the line's own unit and 0.5 without: the reward,
        # in a reward worker, read the `unit` column
        assert right[0] == "1.000" and right[1].endswith(f" {unit}")
        assert alone[0] == "0.500" and wrong[0] == "0.000"


def test_the_example_trains_with_the_users_reward_and_held_out_file(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    output = tmp_path / "run"
    asyncrl(
        "rl", "examples/own_data/rl.yaml", "--model", str(tiny_model_dir),
        "--output_dir", str(output), "--max_steps", "2", "--inference.port", str(free_port()),
        "--orchestrator.batch_size", "8", "--orchestrator.rollouts_per_example", "4",
        "--orchestrator.eval.interval", "2", "--orchestrator.eval.num_examples", "12",
        "--trainer.recipe", "fp32",
    )  # fmt: skip
    records = read_metrics(output / "run_default" / "metrics.jsonl")
    steps = [r for r in records if r["role"] == "orchestrator"]
    assert [r["step"] for r in steps] == [1, 2]
    # a reward that could not read its column would raise (KeyError) and count here
    assert all(r["orchestrator/reward_failures"] == 0 for r in steps)
    assert all("orchestrator/reward/score" in r for r in steps)
    evals = [r for r in records if r["role"] == "eval"]
    assert evals and all(r["eval/units/num_examples"] == 12 for r in evals)
