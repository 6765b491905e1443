"""`asyncrl rl` on the built-in multi-turn environment: guess-number episodes of several turns,
generated token in, token out with the prefix cache on, trained with the sampler's logprobs,
and evaluated online on held-out episodes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncrl.monitor.metrics import read_metrics

from .test_rl_launcher import rl_config, survivors

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_rl_trains_on_multi_turn_episodes(tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "run"
    path = rl_config(
        tiny_model_dir, output, env=[{"id": "guess-number", "args": {"max_turns": 3}}],
        eval={"interval": 3, "num_examples": 4, "rollouts_per_example": 2},
    )  # fmt: skip
    config = yaml.safe_load(path.read_text())
    config["orchestrator"]["sampling"]["max_tokens"] = 4  # per turn
    config["inference"] |= {"dtype": "float32", "enable_prefix_caching": True}
    config["trainer"]["shared_prefix"] = True
    config["max_async_level"] = 0  # on-policy: the trainer's logprobs are the sampler's
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "rl", str(path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]

    run = output / "run_default"
    trainer = read_metrics(run / "metrics.jsonl", role="trainer")
    orchestrator = read_metrics(run / "metrics.jsonl", role="orchestrator")
    assert [r["step"] for r in trainer] == [1, 2, 3]
    assert all(1 <= r["orchestrator/episode/turns_mean"] <= 3 for r in orchestrator)
    assert max(r["orchestrator/episode/turns_max"] for r in orchestrator) >= 2
    for record in orchestrator:
        ends = {k: v for k, v in record.items() if k.startswith("orchestrator/episode/ended_by/")}
        assert sum(ends.values()) == pytest.approx(1.0)
    # held-out episodes played by the servers at steps 0 and 3
    evals = read_metrics(run / "metrics.jsonl", role="eval")
    assert [r["step"] for r in evals] == [0, 3]
    assert all(r["eval/guess-number/num_examples"] == 4 for r in evals)
    assert all(0.0 <= r["eval/guess-number/mean@2"] <= 1.2 for r in evals)
    # the environment's tokens are not trained on; the model's are, with the server's logprobs
    assert max(r["trainer/mismatch_kl"] for r in trainer) < 1e-5
    assert not survivors(str(output))


def test_rl_trains_on_the_tool_environment(tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "run"
    env = {"id": "calculator", "args": {"describe_tools": False}}
    path = rl_config(tiny_model_dir, output, env=[env])
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "rl", str(path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_metrics(output / "run_default" / "metrics.jsonl")
    assert [r["step"] for r in records if r["role"] == "trainer"] == [1, 2, 3]
    # a random model writes no tool call: each episode ends at its first answer
    orchestrator = [r for r in records if r["role"] == "orchestrator"]
    assert all(r["orchestrator/episode/turns_mean"] >= 1 for r in orchestrator)
    assert not survivors(str(output))
