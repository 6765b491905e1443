"""`asyncrl rl` on every engine: a few real steps in which the trainer's logprobs still match
the served ones after every weight reload (the mismatch KL stays at float32 noise)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.contract.conftest import ENGINES, required_vllm_python, tiny_model

from asyncrl.launch.inference_process import free_port
from asyncrl.monitor.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.contract, pytest.mark.slow]

STEPS = 4


@pytest.mark.parametrize("name", ENGINES)
def test_rl_steps_keep_trainer_and_server_logprobs_equal(name: str, tmp_path: Path) -> None:
    inference: dict[str, object] = {"port": free_port(), "max_num_seqs": 32, "dtype": "float32"}
    if name == "vllm":
        inference |= {"backend": "vllm", "executable": required_vllm_python(),
                      "enforce_eager": True, "kv_cache_memory_bytes": 128 << 20,
                      "startup_timeout": 600}  # fmt: skip
    output = tmp_path / "run"
    config = {
        "model": str(tiny_model(tmp_path / "model")), "output_dir": str(output),
        "seq_len": 256, "max_steps": STEPS, "max_async_level": 0, "inference": inference,
        "orchestrator": {"env": [{"id": "reverse-text"}], "batch_size": 16,
                         "rollouts_per_example": 4, "sampling": {"max_tokens": 12}},
        "trainer": {"lora": False, "optimizer": "adamw", "recipe": "fp32",
                    "learning_rate": 1e-3},
    }  # fmt: skip
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "rl", str(path)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, (output / "logs" / "infer.log").read_text()[-3000:]
    trainer = [r for r in read_metrics(output / "run_default" / "metrics.jsonl")
               if r["role"] == "trainer"]  # fmt: skip
    assert [r["step"] for r in trainer] == list(range(1, STEPS + 1))
    # on-policy (max_async_level 0): the weights change every step (lr 1e-3), and each batch
    # must still have been sampled by exactly the weights the trainer holds
    assert max(r["trainer/mismatch_kl"] for r in trainer) < 1e-6
    assert trainer[-1]["trainer/grad_norm"] > 0
