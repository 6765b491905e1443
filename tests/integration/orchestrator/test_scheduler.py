"""Bounded staleness, checked from the per-token policy versions in the batches themselves.

A real embedded server and a real `asyncrl orch` process; the trainer is played by the test and
publishes weights late on purpose: before publishing version s it waits until the orchestrator
has produced batch s + k, which it can only do by running k steps ahead, and checks it went no
further. Timing-independent: a wrong scheduler deadlocks or overruns, it cannot pass by luck.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.launch.inference_process import inference_server
from asyncrl.monitor.metrics import read_metrics
from asyncrl.transport.batches import batch_path, done_path, read_batch, wait_for_batch
from asyncrl.transport.broadcast import publish_weights

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 5


@pytest.mark.parametrize("k", [0, 1, 2])
def test_no_sample_violates_max_async_level_or_max_off_policy_steps(
    k: int, tiny_model_dir: Path, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    run_dir = outputs / "run_default"
    off_policy = k + 1
    with inference_server(
        tiny_model_dir, "--max_model_len", "256", "--weight_roots", f"[{outputs}]"
    ) as url:
        orchestrator = subprocess.Popen(
            [
                sys.executable, "-m", "asyncrl.cli", "orch",
                "--model.name", str(tiny_model_dir), "--client.base_url", f"[{url}/v1]",
                "--output_dir", str(run_dir), "--batch_size", "8", "--rollouts_per_example", "4",
                "--max_steps", str(STEPS), "--max_async_level", str(k),
                "--max_off_policy_steps", str(off_policy), "--oversampling_factor", "2",
                "--sampling.max_tokens", "24", "--sampling.seed", "0",
            ],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
            for step in range(1, STEPS + 1):
                wait_for_batch(run_dir, step, timeout=120)
                if step + k <= STEPS:
                    # a trainer slower than generation: before weights `step` exist, the
                    # orchestrator must still produce batch step + k (and no further)
                    wait_for_batch(run_dir, step + k, timeout=120)
                    time.sleep(0.5)
                    assert not batch_path(run_dir, step + k + 1).exists()
                publish_weights(run_dir, step, model, keep=k + 2)
            output, _ = orchestrator.communicate(timeout=120)
        finally:
            orchestrator.kill()
        assert orchestrator.returncode == 0, output[-3000:]

    lags = []
    for step in range(1, STEPS + 1):
        batch = read_batch(run_dir, step)
        assert len(batch.samples) == 8
        assert batch.max_tokens == 24  # the budget dr_grpo normalises by
        for sample in batch.samples:
            assert max(sample.policy_versions) >= step - 1 - k  # max_async_level
            assert min(sample.policy_versions) >= step - 1 - off_policy  # max_off_policy_steps
            assert len(sample.policy_versions) == len(sample.completion_ids)
            lags.append(step - 1 - min(sample.policy_versions))
    if k == 0:
        assert set(lags) == {0}  # synchronous: every token from the newest weights
    else:
        assert max(lags) >= k  # batches generated k versions ahead of the weights
    assert done_path(run_dir).exists()
    records = read_metrics(run_dir / "metrics.jsonl", role="orchestrator")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(0.0 <= r["orchestrator/reward_mean"] <= 1.0 for r in records)
