"""`asyncrl rl` with a 2-rank trainer (FSDP2 over gloo, ranks started by torchrun): it trains
on-policy with the server's logprobs, and with restarts off a rank killed with SIGKILL stops
the run with a message that names the rank, leaving no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from asyncrl.monitor.metrics import read_metrics

from .test_rl_launcher import assert_every_untied_batch_trained, rl_config, survivors

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 4


def two_rank_config(model: Path, output: Path) -> Path:
    path = rl_config(model, output)
    config = yaml.safe_load(path.read_text())
    config["max_async_level"] = 0  # on-policy: the server's logprobs are the trainer's
    config["inference"]["dtype"] = "float32"
    config["trainer"] |= {"world_size": 2, "learning_rate": 1e-3, "zero_level": 3}
    path.write_text(yaml.safe_dump(config))
    return path


def test_two_trainer_ranks_train_on_policy(tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "run"
    config = two_rank_config(tiny_model_dir, output)
    command = [sys.executable, "-m", "asyncrl.cli", "rl", str(config), "--max_steps", str(STEPS)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    train_log = (output / "logs" / "train.log").read_text()
    assert result.returncode == 0, train_log[-3000:]
    assert "rank 1 of 2" in train_log
    trainer = read_metrics(output / "run_default" / "metrics.jsonl", role="trainer")
    orchestrator = read_metrics(output / "run_default" / "metrics.jsonl", role="orchestrator")
    assert [r["step"] for r in trainer] == list(range(1, STEPS + 1))  # rank 0 alone writes
    # every step on-policy while the weights move (lr 1e-3): the gathered weights the server
    # loaded are exactly the ones the two ranks hold
    assert max(r["trainer/mismatch_kl"] for r in trainer) < 1e-6
    assert_every_untied_batch_trained(trainer, orchestrator)
    for rank in (0, 1):
        assert trainer[-1][f"trainer/rank_{rank}/peak_memory_bytes"] > 0
    assert not survivors(str(output))


def rank_pids(output: Path) -> dict[int, int]:
    """Rank -> pid of the trainer ranks of this run (torchrun's workers)."""
    found = {}
    for line in survivors(str(output)):
        pid_text, _, args = line.strip().partition(" ")
        if "asyncrl.cli train" not in args or "torch.distributed.run" in args:
            continue
        try:
            environ = Path(f"/proc/{pid_text}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        variables = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        if b"RANK" in variables:
            found[int(variables[b"RANK"])] = int(pid_text)
    return found


def test_a_killed_rank_stops_the_run_naming_the_rank(tiny_model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "killed"
    config = two_rank_config(tiny_model_dir, output)
    # restarts off: with them, the trainer would come back (see test_restarts.py)
    command = [sys.executable, "-m", "asyncrl.cli", "rl", str(config), "--max_steps", "1000",
               "--restart.max_restarts", "0"]  # fmt: skip
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = output / "run_default" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and read_metrics(metrics, role="trainer")):
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.2)
    ranks = rank_pids(output)
    assert sorted(ranks) == [0, 1]
    os.kill(ranks[1], signal.SIGKILL)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode != 0
    message = stderr.decode(errors="replace")
    assert "`asyncrl train` exited" in message
    assert "rank 1 exited (SIGKILL)" in message, message[-3000:]
    deadline = time.monotonic() + 30
    while survivors(str(output)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not survivors(str(output))
