"""`deployment: colocated`: one process trains and serves. Six on-policy steps on the tiny model
with weights synced in memory: no broadcast directory but at checkpoints, the sampler's
logprobs equal the trainer's on every step, and each step's weights are installed in memory."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from asyncrl.monitor.metrics import read_metrics

from .test_rl_launcher import (
    assert_every_untied_batch_trained,
    rl_config,
    server_headers,
    survivors,
    with_run_secret,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 6


def colocated_config(model: Path, output: Path) -> tuple[Path, int]:
    path = rl_config(model, output)
    config = yaml.safe_load(path.read_text())
    config |= {"deployment": "colocated", "max_steps": STEPS, "max_async_level": 0}
    config["inference"]["dtype"] = "float32"
    config["orchestrator"]["ckpt"] = {"interval": 3}
    config["trainer"]["learning_rate"] = 1e-3  # the weights move visibly every step
    path.write_text(yaml.safe_dump(config))
    return path, config["inference"]["port"]


def test_colocated_run_syncs_weights_in_memory_every_step(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    output = tmp_path / "run"
    path, port = colocated_config(tiny_model_dir, output)
    process = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "rl", str(path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=with_run_secret(),
    )  # fmt: skip
    versions: list[int] = []
    deadline = time.monotonic() + 600
    while process.poll() is None and time.monotonic() < deadline:
        try:  # the trainer's own server, polled while the run goes on
            info = httpx.get(f"http://127.0.0.1:{port}/weight_info", timeout=2,
                             headers=server_headers()).json()  # fmt: skip
            if not versions or info["version"] != versions[-1]:
                versions.append(info["version"])
        except httpx.HTTPError:
            pass  # not up yet, or already gone
        time.sleep(0.02)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr[-3000:]

    assert sorted(p.name for p in (output / "logs").iterdir()) == ["orch.log", "train.log"]
    run = output / "run_default"
    # weights went to disk only at the checkpoints (steps 3 and 6), for export
    assert sorted(p.name for p in (run / "broadcasts").glob("step_*")) == ["step_3", "step_6"]
    # the server is polled every 20 ms, so it can publish the last version and shut down between
    # two polls: the versions seen only climb, and the log says each one was installed in memory
    assert versions == sorted(versions) and set(versions) <= set(range(STEPS + 1))
    assert len(versions) > 1 and versions[-1] >= STEPS - 1, versions
    train_log = (output / "logs" / "train.log").read_text()
    for version in range(1, STEPS + 1):
        assert f"installed weights version {version} (memory)" in train_log
    trainer = read_metrics(run / "metrics.jsonl", role="trainer")
    orchestrator = read_metrics(run / "metrics.jsonl", role="orchestrator")
    assert [r["step"] for r in trainer] == list(range(1, STEPS + 1))
    # every batch s was sampled by weights s − 1 exactly, and the sampler's logprobs are the
    # trainer's to float32 noise, though the weights change every step
    assert all(r["orchestrator/staleness/le_16/max"] == 0 for r in orchestrator)
    assert max(r["trainer/mismatch_kl"] for r in trainer) < 1e-6
    assert_every_untied_batch_trained(trainer, orchestrator)
    for record in trainer:
        assert record["inference/kv_cache_bytes"] > 0
        assert record["colocated/kv_cache_freed_bytes"] == record["inference/kv_cache_bytes"]
    assert not survivors(str(output))
