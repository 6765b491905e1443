"""The `asyncrl` command as a user meets it: a real process, its output and exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml


def asyncrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_no_arguments_lists_the_commands() -> None:
    result = asyncrl()
    assert result.returncode == 0
    for command in ("init-model", "sft", "eval", "infer", "orch", "train", "rl"):
        assert command in result.stdout


def test_help_lists_every_field_with_description_and_default() -> None:
    result = asyncrl("rl", "--help")
    assert result.returncode == 0
    assert "--trainer.loss.kl_tau  (float; default 0.0)" in result.stdout
    assert "KL penalty coefficient" in result.stdout
    assert "--orchestrator.filters[].window" in result.stdout
    assert "--inference.tp" in result.stdout and "not supported yet" in result.stdout


def test_print_config_shows_the_merged_result(tmp_path: Path) -> None:
    config_file = tmp_path / "rl.yaml"
    config_file.write_text("model: m\ntrainer:\n  loss:\n    kl_tau: 0.02\n")
    result = asyncrl("rl", str(config_file), "--trainer.loss.adv_tau", "0.5", "--print-config")
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    loss = printed["trainer"]["loss"]
    assert (loss["kl_tau"], loss["adv_tau"], loss["type"]) == (0.02, 0.5, "masked_is")
    assert printed["orchestrator"]["model"]["name"] == "m"


def test_config_error_exits_2_naming_the_key() -> None:
    result = asyncrl("train", "--model", "m", "--loss.kl_tau", "-1")
    assert result.returncode == 2
    assert "`loss.kl_tau`" in result.stderr and "greater than or equal to 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_command_exits_2() -> None:
    result = asyncrl("fly")
    assert result.returncode == 2 and "unknown command 'fly'" in result.stderr
