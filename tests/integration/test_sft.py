"""`asyncrl sft` end to end in a real process on a tiny model: loss falls, checkpoint reloads."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.monitor.metrics import read_headers, read_metrics
from asyncrl.precision import default_device, describe_device

pytestmark = pytest.mark.integration


def test_short_sft_run_lowers_loss_and_saves_a_loadable_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    output_dir = tmp_path / "sft"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "sft",
            "--model",
            str(tiny_model_dir),
            "--output_dir",
            str(output_dir),
            "--num_examples",
            "1500",
            "--max_steps",
            "60",
            "--sequence_len",
            "256",
            "--per_device_train_batch_size",
            "4",
            "--learning_rate",
            "3e-3",
            "--warmup_steps",
            "5",
            "--save_steps",
            "20",
            "--eval_examples",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr

    records = read_metrics(output_dir / "metrics.jsonl", role="sft")
    losses = [r["sft/loss"] for r in records if "sft/loss" in r]
    assert [r["step"] for r in records if "sft/loss" in r] == list(range(1, 61))
    # a random model starts near ln(128) = 4.85 nats; within 60 steps a working loop reaches at
    # least the character-frequency plateau near ln(26) = 3.26, a fall of well over one nat
    assert statistics.fmean(losses[:3]) - statistics.fmean(losses[-5:]) > 1.0
    (header,) = read_headers(output_dir / "metrics.jsonl", role="sft")
    native = describe_device(default_device()).native_bf16
    assert header["precision/requested"] == "auto"  # the default, resolved on this machine
    assert header["precision/recipe"] == ("bf16" if native else "fp32")
    eval_rewards = [r["sft/eval_greedy_reward"] for r in records if "sft/eval_greedy_reward" in r]
    assert len(eval_rewards) == 1 and 0.0 <= eval_rewards[0] <= 1.0

    final = output_dir / "final"
    assert (output_dir / "checkpoints" / "step_20" / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert tokenizer.decode(tokenizer("ab c")["input_ids"]) == "ab c"
    assert model.config.vocab_size == 128
    assert not [p for p in output_dir.rglob("*.tmp")]  # nothing half-written left behind
