"""Every command the docs show is one the CLI takes.

Each `asyncrl …` command of README.md, docs/*.md, the example configs' comments and the
Makefile's recipes (found by `doc_commands.py`) has its configuration built and validated the
way the command does before it runs anything (`load_command_config`, what `--print-config`
prints), without running the job: the sub-command exists, a config file given exists and
loads, every flag is a key of the command, the overrides apply, and the config model's checks
pass. So a refused combination (`--weight_broadcast.type nccl` with vLLM), a misspelt key, or a
bare path that the CLI reads as a config file (`asyncrl eval RUN_DIR`) fails here. `plot` is
parsed by its own argument parser (nothing drawn); a `make …` line must name targets of the
Makefile.

What stands in for what, and why:
- a command whose name is a placeholder (`asyncrl <command> --help`) is a synopsis: skipped. A
  positional `CONFIG` stands for a config file of the command: the stand-in config below.
- inline code in prose that names no config file (`asyncrl rl --launcher ray`) is part of a
  command: its flags are checked on top of the stand-in config, which sets only what the
  command requires (a model named `m`). A command in a fenced block or an example's comment is
  checked as written.
- model directories and run outputs (`outputs/…`, `models/…`) need not exist: building a config
  never opens a model, so none is made here. Relative paths are taken from the repository root,
  and a `PYTHONPATH=…` in front of a command is put on `sys.path` while it is checked.
- `deployment: auto` is resolved for the machine the test runs on, as the command would.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from tests.unit.doc_commands import DocCommand, all_commands, make_targets, words

from asyncrl.cli import COMMANDS
from asyncrl.config.base import ConfigError
from asyncrl.config.loading import load_command_config

ROOT = Path(__file__).resolve().parents[2]
# the least a command needs to validate, for `CONFIG` and for a command written in part
STAND_IN: dict[str, dict[str, object]] = {
    "rl": {"model": "m"}, "train": {"model": "m"}, "infer": {"model": "m"},
    "orch": {"model": {"name": "m"}}, "sft": {"model": "m"}, "eval": {"model": "m"},
    "score": {"env": {"id": "reverse-text"}}, "env-server": {"env": {"id": "reverse-text"}},
    "export": {"source": "outputs/rl", "output_dir": "models/exported"},
    "init-model": {}, "get-model": {},
}  # fmt: skip


def check_make(tokens: list[str]) -> None:
    """`make TARGET …`: every target is one of the Makefile's."""
    named = [token for token in tokens[1:] if not token.startswith("-") and "=" not in token]
    unknown = sorted(set(named) - make_targets())
    assert not unknown, f"no such Makefile target: {unknown}"


def check_plot(arguments: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`asyncrl plot ARGUMENTS` through its own parser, with the drawing left out."""
    from asyncrl.monitor import plot

    drawn = []
    monkeypatch.setattr(plot, "plot", lambda *args: drawn.append(args) or Path("out.png"))
    try:
        assert plot.main(arguments) == 0
    except SystemExit as error:  # argparse's refusal
        raise AssertionError(f"asyncrl plot refuses {arguments}") from error
    assert drawn


def check_asyncrl(
    name: str,
    arguments: list[str],
    partial: bool,
    stand_in: Path | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`asyncrl NAME ARGUMENTS` as the CLI reads it; `stand_in` is the stand-in config of NAME."""
    if name == "plot":
        check_plot(arguments, monkeypatch)
        return
    if name == "migrate-checkpoint":
        assert partial or arguments, "`asyncrl migrate-checkpoint` takes the paths to convert"
        assert not any(arg.startswith("-") for arg in arguments), arguments
        return
    assert name in COMMANDS and stand_in is not None, f"`asyncrl {name}`: no such command"
    if "--help" in arguments or "-h" in arguments:
        return
    arguments = [str(stand_in) if arg in ("CONFIG", "CONFIG.yaml") else arg for arg in arguments]
    if partial and (not arguments or arguments[0].startswith("--")):
        arguments = [str(stand_in), *arguments]
    load_command_config(COMMANDS[name].config, arguments)


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("stand_in_configs")
    for name, config in STAND_IN.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return {name: folder / f"{name}.yaml" for name in STAND_IN}


COMMANDS_SHOWN = all_commands()


def test_the_docs_show_commands_where_expected() -> None:
    """The parser finds the commands it is meant to: a change to the pages' form that hid
    them from it would otherwise pass unseen."""
    shown = {command.where.split(":")[0] for command in COMMANDS_SHOWN}
    assert {"README.md", "docs/gpu.md", "docs/own-data.md", "Makefile"} <= shown
    assert "examples/reverse_text/infer.yaml" in shown
    assert len(COMMANDS_SHOWN) > 150


def test_every_command_has_a_stand_in_config() -> None:
    assert set(STAND_IN) == set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS_SHOWN, ids=lambda c: f"{c.where} {c.text[:60]}")
def test_command_in_the_docs_is_valid(
    command: DocCommand, stand_ins: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    environment, tokens = words(command)
    if tokens and tokens[0] == "make":
        check_make(tokens)
        return
    start = next(i for i, token in enumerate(tokens) if re.search(r"(^|/)asyncrl(\.cli)?$", token))
    name, *arguments = tokens[start + 1 :]
    if name == "PLACEHOLDER":
        return  # a synopsis: `asyncrl <command> --help`
    monkeypatch.chdir(ROOT)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    for entry in reversed(environment.get("PYTHONPATH", "").split(":")):
        if entry:
            monkeypatch.syspath_prepend(str(ROOT / entry))
    for one_name in name.split("|"):  # `asyncrl infer|orch|train`
        try:
            check_asyncrl(
                one_name, arguments, command.partial, stand_ins.get(one_name), monkeypatch
            )
        except ConfigError as error:
            pytest.fail(f"{command.where}: `{command.text}` is refused:\n{error}")
