"""`orchestrator.eval` and `report_to` in a real `asyncrl rl` run: held-out scores at the steps
asked for, on the weights version each names, while training goes on; and the same records in
TensorBoard's event files and W&B's offline run as in metrics.jsonl."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from asyncrl.monitor.metrics import read_metrics

from .test_rl_launcher import rl_config, survivors
from .wandb_offline import history

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EVAL = {
    "interval": 2, "num_examples": 6, "rollouts_per_example": 2, "max_concurrent": 1,
    "sampling": {"temperature": 1.0, "max_tokens": 10, "seed": 3},
    "env": [{"id": "arithmetic", "name": "sums"}],
}  # fmt: skip
# one eval request at a time: step 0's evaluation then outlasts the first training step, so a
# step-0 record that did not hold the rollouts back would span version 1 (checked: it fails)


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("eval_run") / "run"
    config = rl_config(tiny_model_dir, output, eval=EVAL)
    data = yaml.safe_load(config.read_text())
    data["report_to"] = {"trackers": ["wandb", "tensorboard"], "interval": 3}
    config.write_text(yaml.safe_dump(data))
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "rl", str(config), "--max_steps", "6"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert not survivors(str(output))
    return output / "run_default"


def test_eval_every_two_steps_records_steps_0_2_4_6_with_their_versions(run_dir: Path) -> None:
    records = read_metrics(run_dir / "metrics.jsonl", role="eval")
    for env in ("reverse-text", "sums"):
        mine = sorted((r for r in records if f"eval/{env}/mean@2" in r), key=lambda r: r["step"])
        assert [r["step"] for r in mine] == [0, 2, 4, 6]
        for record in mine:
            step, version = record["step"], record[f"eval/{env}/version"]
            assert step <= version <= record[f"eval/{env}/version_max"] <= 6
            assert record[f"eval/{env}/num_examples"] == 6
            assert 0.0 <= record[f"eval/{env}/mean@2"] <= record[f"eval/{env}/best@2"] <= 1.0
        assert (mine[0][f"eval/{env}/version"], mine[-1][f"eval/{env}/version"]) == (0, 6)
        assert mine[0][f"eval/{env}/version_max"] == 0  # the starting weights alone, not trained on
    trainer_steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl", "trainer")]
    assert trainer_steps == [1, 2, 3, 4, 5, 6]  # evaluation took no training step away


def expected_values(run_dir: Path) -> dict[tuple[str, int], float]:
    """(key, step) -> value of every numeric record key, as metrics.jsonl has it."""
    return {
        (key, record["step"]): value
        for record in read_metrics(run_dir / "metrics.jsonl")
        for key, value in record.items()
        if "/" in key and isinstance(value, int | float) and not isinstance(value, bool)
    }


def test_tensorboard_holds_the_same_values_as_metrics_jsonl(run_dir: Path) -> None:
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    found = {
        (tag, event.step): event.value
        for tag in events.Tags()["scalars"]
        for event in events.Scalars(tag)
    }
    expected = expected_values(run_dir)
    assert found.keys() == expected.keys()
    for key, value in expected.items():
        assert found[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key  # float32 on disk
    assert {"trainer/loss", "orchestrator/reward_mean", "eval/sums/mean@2"} <= {
        tag for tag, _ in found
    }
    tables = events.Tensors("samples/text_summary")  # the sample tables, as markdown text
    assert [table.step for table in tables] == [3, 6]


def test_wandb_offline_history_holds_the_same_values_and_the_sample_tables(
    run_dir: Path,
) -> None:
    logged = history(run_dir)
    found = {
        (key, entry["step"]): value
        for entry in logged
        for key, value in entry.items()
        if "/" in key and not key.startswith(("_", "samples/"))  # a table's fields are nested
    }
    found_numbers = {k: v for k, v in found.items() if isinstance(v, int | float)}
    assert found_numbers == pytest.approx(expected_values(run_dir))
    tables = [entry for entry in logged if "samples/_type" in entry]
    assert [entry["step"] for entry in tables] == [3, 6]
    assert all(entry["samples/_type"] == "table-file" for entry in tables)
