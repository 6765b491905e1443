"""`asyncrl rl` with a `judge` section: the judge server is a fourth role (its config, log and
restarts), the orchestrator scores every rollout with it beside the rule-based reward, and when
the judge is killed mid-run the rollouts it would have judged cost their reward while the run
goes on and ends."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from examples.judges.judge_data import JUDGE_PROMPT

from asyncrl.monitor.metrics import read_metrics

from .run_processes import signal_running, wait_for_pid
from .test_restarts import wait_for_trainer_step
from .test_rl_launcher import rl_config, survivors

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 10  # the judge is killed past the trainer's step 2: 8 steps before the run ends
JUDGE_TERM = {
    "type": "judge", "name": "judge", "weight": 0.5, "read": "verdict", "prompt": JUDGE_PROMPT,
    "verdicts": {"y": 1.0, "n": 0.0}, "retries": 0, "timeout": 10,
}  # fmt: skip


def judge_run_config(model: Path, judge: Path, output: Path) -> Path:
    path = rl_config(model, output, env=[{"id": "reverse-text", "model_rewards": [JUDGE_TERM]}])
    config = yaml.safe_load(path.read_text())
    config["judge"] = {"model": str(judge), "max_model_len": 256}
    path.write_text(yaml.safe_dump(config))
    return path


def test_rl_starts_a_judge_that_scores_beside_the_rubric_and_is_restarted_when_killed(
    tiny_model_dir: Path, tiny_judge_dir: Path, tmp_path: Path
) -> None:
    output = tmp_path / "run"
    config = judge_run_config(tiny_model_dir, tiny_judge_dir, output)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "rl", str(config), "--max_steps", str(STEPS),
         "--restart.backoff", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        judge = wait_for_pid(output, "judge.yaml", launcher)
        wait_for_trainer_step(output / "run_default", 2, launcher)
        signal_running(judge, signal.SIGKILL, "the judge")  # the judge goes down mid-run
        _, errors = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, errors[-3000:]
    assert "`asyncrl judge` exited with code -9 (SIGKILL); restart 1 of 3" in errors
    assert (output / "logs" / "judge.log").exists()
    judge_config = yaml.safe_load((output / "configs" / "judge.yaml").read_text())
    assert (judge_config["host"], judge_config["model"]) == ("127.0.0.1", str(tiny_judge_dir))
    orch_config = yaml.safe_load((output / "configs" / "orch.yaml").read_text())
    [term] = orch_config["env"][0]["model_rewards"]
    assert term["base_url"] == f"http://127.0.0.1:{judge_config['port']}/v1"

    records = read_metrics(output / "run_default" / "metrics.jsonl", role="orchestrator")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    prefix = "orchestrator/model_reward/judge"
    scored = sum(r[f"{prefix}/scored"] for r in records)
    lost = sum(r[f"{prefix}/failed/unavailable"] + r[f"{prefix}/failed/timeout"] for r in records)
    assert scored > 0 and lost > 0, (scored, lost)
    assert all(0.0 <= r["orchestrator/reward/judge"] <= 1.0 for r in records)
    assert all(r["orchestrator/reward/lcs_ratio"] > 0 for r in records)  # still scored
    assert not survivors(str(output))
