"""Kill the trainer with SIGKILL mid-run with automatic restarts off, restart `asyncrl rl` by
hand with `ckpt.resume_step -1`: the run completes with every step id exactly once and nothing
half-written left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncrl.monitor.metrics import read_metrics
from asyncrl.transport.broadcast import stable_steps

from .run_processes import role_marker, signal_running, wait_for_pid
from .test_rl_launcher import rl_config, survivors

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 12  # the trainer is killed past step 4: 8 steps before the run ends (`run_processes.py`)


def rl(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "asyncrl.cli", "rl", str(config), "--max_steps", str(STEPS),
            "--restart.max_restarts", "0", *extra]  # fmt: skip


def test_sigkilled_trainer_resumes_with_every_step_exactly_once(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    output = tmp_path / "run"
    run_dir = output / "run_default"
    config = rl_config(tiny_model_dir, output, ckpt={"interval": 2})
    launcher = subprocess.Popen(rl(config), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    trainer = wait_for_pid(output, role_marker("train"), launcher)
    checkpoint = run_dir / "checkpoints" / "step_4"
    deadline = time.monotonic() + 300
    while not all(
        (checkpoint / role / "COMPLETE").exists() for role in ("trainer", "orchestrator")
    ):
        assert launcher.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    signal_running(trainer, signal.SIGKILL, "`asyncrl train`")
    _, errors = launcher.communicate(timeout=120)
    assert launcher.returncode == 1 and b"`asyncrl train` exited with code -9" in errors
    assert not survivors(str(output))

    resumed = subprocess.run(
        rl(config, "--orchestrator.ckpt.resume_step", "-1"),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = read_metrics(run_dir / "metrics.jsonl")
    for role in ("trainer", "orchestrator"):
        assert sorted(r["step"] for r in records if r["role"] == role) == list(range(1, STEPS + 1))
    assert STEPS in stable_steps(run_dir)
    leftovers = [p for p in output.rglob("*") if p.suffix == ".tmp" or (
        p.name.startswith(".") and p.name != ".metadata"  # DCP's index of a checkpoint's shards
    )]  # fmt: skip
    assert not leftovers  # no staging file or directory survived the crash
    assert not survivors(str(output))
