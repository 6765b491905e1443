"""`asyncrl eval` on what a run leaves: LoRA broadcasts read directly, all checkpoints at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from asyncrl.config.eval import EvalRunConfig
from asyncrl.evaluate import run_eval
from asyncrl.monitor.metrics import read_metrics
from asyncrl.transport.broadcast import publish_weights

pytestmark = pytest.mark.integration


def lora_run(base: Path, run_dir: Path, steps: list[int]) -> torch.nn.Module:
    """A run directory with LoRA broadcasts at `steps` (random, non-zero adapters, as a
    trainer's would be); returns the last policy merged, the reference."""
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    policy = get_peft_model(model, config)
    for step in steps:
        with torch.no_grad():
            for name, parameter in policy.named_parameters():
                if "lora_" in name:
                    parameter.add_(0.3 * torch.randn_like(parameter))
        publish_weights(run_dir, step, policy, keep=10)
    return policy.merge_and_unload()


def test_a_lora_broadcast_scores_as_its_merged_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    run_dir = tmp_path / "run"
    merged = lora_run(tiny_model_dir, run_dir, [3])
    merged.save_pretrained(tmp_path / "merged")
    common = {"num_examples": 12, "max_tokens": 12, "tokenizer": str(tiny_model_dir)}
    adapter = run_eval(EvalRunConfig(model=str(run_dir / "broadcasts" / "step_3"), **common))
    reference = run_eval(EvalRunConfig(model=str(tmp_path / "merged"), **common))
    assert adapter[0].result.completions == reference[0].result.completions
    assert adapter[0].result.rewards == reference[0].result.rewards
    base = run_eval(EvalRunConfig(model=str(tiny_model_dir), **common))
    assert base[0].result.completions != adapter[0].result.completions  # the adapter matters


def test_a_run_directory_scores_every_checkpoint_in_one_call(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    lora_run(tiny_model_dir, run_dir, [2, 4])
    metrics = tmp_path / "eval.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "eval", "--model", str(run_dir),
         "--num_examples", "6", "--max_tokens", "8", "--rollouts_per_example", "2",
         "--temperature", "1.0", "--metrics_file", str(metrics)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split() for line in result.stdout.splitlines()]
    assert rows[0][1:] == ["step", "mean@2", "best@2", "pass@2"]
    assert [row[1] for row in rows[1:]] == ["2", "4"]
    records = read_metrics(metrics, role="eval")
    assert [r["step"] for r in records] == [2, 4]
    assert [f"{r['eval/reverse-text/mean@2']:.4f}" for r in records] == [row[2] for row in rows[1:]]
