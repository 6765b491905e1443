"""Every example config loads under the command it is written for, and its comments say how to
run it (a command that `test_doc_commands.py` checks as the CLI would)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.doc_commands import ROOT, commands_in_example

from asyncrl.cli import COMMANDS
from asyncrl.config.loading import load_config

EXAMPLES = sorted(Path(__file__).resolve().parents[2].glob("examples/*/*.yaml"))
COMMAND_OF = {"rl": "rl", "rl_ray": "rl", "infer": "infer", "orch": "orch", "train": "train",
              "sft": "sft", "eval": "eval", "score": "score"}  # fmt: skip


def test_there_are_examples() -> None:
    assert {p.parent.name for p in EXAMPLES} >= {"reverse_text", "countdown", "math"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_example_config_is_valid(path: Path) -> None:
    command = COMMANDS[COMMAND_OF[path.stem]]
    overrides = ["--model", "m"] if path.stem in ("eval", "sft") else []  # given at run time
    load_config(command.config, [str(path)], overrides)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_example_config_names_the_command_that_runs_it(path: Path) -> None:
    shown = [command.text for command in commands_in_example(path)]
    assert any(str(path.relative_to(ROOT)) in text for text in shown), shown
