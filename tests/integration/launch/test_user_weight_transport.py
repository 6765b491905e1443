"""A weight transport added in one module (`user_transport/spool_weights.py`, test-only) runs
through `asyncrl rl` by naming it in the config: the trainer publishes by it, every server
installs by it, and the orchestrator's wait for weights, which knows nothing of it, is met."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncrl.launch.inference_process import free_port
from asyncrl.monitor.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

USER_MODULES = Path(__file__).resolve().parent / "user_transport"


def test_a_transport_named_by_import_path_carries_every_version(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    output = tmp_path / "run"
    config = {
        "model": str(tiny_model_dir), "output_dir": str(output), "seq_len": 256,
        "max_steps": 3, "max_async_level": 0,
        "inference": {"port": free_port(), "max_num_seqs": 32},
        "orchestrator": {"env": [{"id": "reverse-text"}], "batch_size": 8,
                         "rollouts_per_example": 4, "sampling": {"max_tokens": 12}},
        "trainer": {"lora": False, "optimizer": "adamw", "recipe": "fp32",
                    "learning_rate": 1e-4,
                    "weight_broadcast": {"type": "spool_weights:TRANSPORT",
                                         "port": free_port()}},
    }  # fmt: skip
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(config))
    python_path = os.pathsep.join([str(USER_MODULES), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "rl", str(path)], capture_output=True, text=True,
        timeout=600, env={**os.environ, "PYTHONPATH": python_path},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]

    served = yaml.safe_load((output / "configs" / "infer.yaml").read_text())
    assert served["weight_broadcast_type"] == "spool_weights:TRANSPORT"  # passed to the server
    records = read_metrics(output / "run_default" / "metrics.jsonl")
    trainer = [r for r in records if r["role"] == "trainer"]
    assert [r["spool/published_versions"] for r in trainer] == [1.0, 2.0, 3.0]
    # with max_async_level 0, step s's rollouts needed version s - 1 on the server: only the
    # spool carried it there
    assert [r["step"] for r in records if r["role"] == "orchestrator"] == [1, 2, 3]
    log = (output / "logs" / "infer.log").read_text()
    for version in (1, 2):
        assert f"installed weights version {version} (spool)" in log
    markers = [
        json.loads((output / "run_default" / "broadcasts" / f"step_{s}" / "STABLE").read_text())
        for s in (2, 3)  # the newest two are kept
    ]
    assert [m["kind"] for m in markers] == ["pushed", "pushed"]


def test_a_name_that_is_no_transport_is_refused_at_start(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "train", "--model", str(tiny_model_dir),
         "--output_dir", str(tmp_path), "--weight_broadcast.type", "json:dumps"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    assert "`trainer.weight_broadcast.type: json:dumps` is not a weight transport" in (
        result.stderr
    )
