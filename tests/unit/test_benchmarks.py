"""The benchmarks kept in `benchmarks/` take the command lines they are run with.

A benchmark runs for minutes to hours, so what is checked here is everything before the run:
each script imports, answers `--help` through its own `main`, and its parser takes the command
line that its RESULTS entry or a doc gives (nothing is run: the parser is built alone). Every
script of `benchmarks/` with a `__main__` must have a command line here, so a new benchmark
gets its check when it lands. Where one script builds another's command line (the race starts
TRL's contestant, `race_trl.py`), the line it builds is parsed by the other's parser.

The scripts import each other by name (`from machine import cpu_name`), as they do when run
from the repository root, so `benchmarks/` goes on `sys.path` for these tests.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from asyncrl.config.loading import load_config
from asyncrl.config.rl import RLConfig

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"

# script: (a command line it is run with, what its parser makes of some of it)
COMMAND_LINES: dict[str, tuple[str, dict[str, Any]]] = {
    "rl_vs_trl": (
        "--workload smollm2-products --sft models/smollm2-135m-instruct --seeds 3 --first-seed 0"
        " --budget 540 --every 6 6 2 --prompts 64 --target-gain 0.2 --systems asyncrl trl"
        " --examples 2000 --max-steps 2000 --out /tmp/race_products"
        " --set trainer.recipe=fp32 inference.dtype=float32",
        {
            "workload": "smollm2-products",
            "every": [6, 6, 2],
            "systems": ["asyncrl", "trl"],
            "set": ["trainer.recipe=fp32", "inference.dtype=float32"],
            "budget": 540.0,
        },
    ),
    "race_trl": (
        "--sft models/smollm2-135m-instruct --out /tmp/trl --env reasoning-gym/chain_sum"
        " --budget 540 --every 2 --batch 32 --group 8 --max-tokens 32 --loss-type grpo"
        " --epsilon 0.2 --lora-rank 16 --lora-alpha 32 --lora-targets q_proj v_proj",
        {"every": 2, "loss_type": "grpo", "lora_rank": 16, "lora_targets": ["q_proj", "v_proj"]},
    ),
    "machine_use": (
        "--model models/smollm2-135m-instruct --steps 16 --fp32 --replay 3",
        {"model": Path("models/smollm2-135m-instruct"), "steps": 16, "fp32": True, "replay": 3},
    ),
    "real_model_generation": (
        "--model models/smollm2-135m-instruct --workloads 8x8x128 4x8x24 --rounds 4"
        " --vllm-python '' --precisions float32 bfloat16 float32+int8 --no-generate",
        {
            "workloads": ["8x8x128", "4x8x24"],
            "rounds": 4,
            "precisions": ["float32", "bfloat16", "float32+int8"],
            "generate": False,
        },
    ),
    "trainer_flops": (
        "--model models/gemma3-270m --modes lora full --steps 5",
        {"modes": ["lora", "full"], "steps": 5},
    ),
    "faults": ("--trials 12 --weights nccl", {"trials": 12, "weights": "nccl"}),
    "setup_time": ("--seeds 3", {"seeds": 3}),
    "trainer_scaling": ("--preset base --steps 3", {"preset": "base", "steps": 3}),
    "weight_sync": (
        "--preset small --steps 2 --lr 1e-5 --dtypes bfloat16 float32",
        {"preset": "small", "steps": 2, "lr": 1e-5, "dtypes": ["bfloat16", "float32"]},
    ),
    "qlora": (
        "--repeats 8 --recipes fp32 bf16 --parts memory step_time",
        {"repeats": 8, "recipes": ["fp32", "bf16"], "parts": ["memory", "step_time"]},
    ),
    "decode_trees": (
        "--model models/smollm2-135m-instruct --trees /tmp/old/src src --rows 40 --rounds 6"
        " --repeats 3 --dtype bfloat16",
        {"trees": ["/tmp/old/src", "src"], "rows": 40, "dtype": "bfloat16", "child": False},
    ),
    "lora_reload": (
        "--model models/smollm2-135m-instruct --trees /tmp/old/src src --rounds 4 --reloads 8"
        " --rank 16",
        {"trees": ["/tmp/old/src", "src"], "rounds": 4, "reloads": 8, "rank": 16},
    ),
}


class Parsed(Exception):
    """Raised in place of `parse_args` by a script's `main`: carries the parser it built."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parsed")
        self.parser = parser


@pytest.fixture
def benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def script(name: str) -> ModuleType:
    return importlib.import_module(name)


def built_parser(module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The script's `parser()`; for a script whose `main` builds its parser first thing
    (`rl_vs_trl.py`), the parser that `main` hands to `parse_args`, caught there."""
    if hasattr(module, "parser"):
        return module.parser()

    def caught(self: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
        raise Parsed(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", caught)
        with pytest.raises(Parsed) as parsed:
            module.main()
    return parsed.value.parser


def test_every_benchmark_script_has_a_command_line_checked_here() -> None:
    scripts = {path.stem for path in BENCHMARKS.glob("*.py") if "__main__" in path.read_text()}
    assert scripts == set(COMMAND_LINES), "a script of benchmarks/ without a check here, or gone"


@pytest.mark.usefixtures("benchmarks_importable")
@pytest.mark.parametrize("name", sorted(COMMAND_LINES))
def test_a_benchmark_answers_help_through_its_main_without_running(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = script(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")


@pytest.mark.usefixtures("benchmarks_importable")
@pytest.mark.parametrize("name", sorted(COMMAND_LINES))
def test_a_benchmark_takes_the_command_line_it_is_run_with(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    line, expected = COMMAND_LINES[name]
    args = built_parser(script(name), monkeypatch).parse_args(shlex.split(line))
    assert {key: getattr(args, key) for key in expected} == expected


@pytest.mark.usefixtures("benchmarks_importable")
def test_a_race_variant_is_parsed_into_its_name_and_overrides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    line = (
        "--workload smollm2 --sft m --systems --variant "
        "k2:max_async_level=2,orchestrator.max_off_policy_steps=3"
    )
    args = built_parser(script("rl_vs_trl"), monkeypatch).parse_args(shlex.split(line))
    assert args.systems == []
    assert args.variant == [
        ("asyncrl-k2", ["--max_async_level", "2", "--orchestrator.max_off_policy_steps", "3"])
    ]


@pytest.mark.usefixtures("benchmarks_importable")
def test_the_race_hands_trl_a_command_line_its_contestant_parses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For every workload TRL can race: `run_trl`'s command, caught before it starts, is one
    `race_trl.py` takes, with the workload's batch, group, tokens, loss and adapters."""
    race, contestant = script("rl_vs_trl"), script("race_trl")

    class Started(Exception):
        pass

    def started(command: list[str], **_: Any) -> None:
        raise Started(command)

    monkeypatch.setattr(race.subprocess, "Popen", started)
    raced = []
    for workload, files in race.WORKLOADS.items():
        settings = load_config(RLConfig, [str(ROOT / f) for f in files],
                               ["--model", "sft", "--trainer.recipe", "fp32"])  # fmt: skip
        try:
            race.trl_loss_arguments(settings.trainer.loss)
        except SystemExit:
            continue  # a loss TRL has no match for: the race refuses it before any run
        with pytest.raises(Started) as caught:
            race.run_trl(0, settings, Path("sft"), tmp_path / workload, 540.0, 2, 2000)
        command = caught.value.args[0]
        assert Path(command[1]) == BENCHMARKS / "race_trl.py"
        args = contestant.parser().parse_args(command[2:])
        orchestrator, trainer = settings.orchestrator, settings.trainer
        assert (args.batch, args.group, args.max_tokens) == (
            orchestrator.batch_size, orchestrator.rollouts_per_example,
            orchestrator.sampling.max_tokens,
        )  # fmt: skip
        assert args.loss_type == race.TRL_LOSSES[trainer.loss.type]
        assert args.lora_rank == (trainer.lora_rank if trainer.lora else 0)
        assert args.mask_truncated == orchestrator.mask_truncated_completions
        raced.append(workload)
    assert raced, "no workload TRL can race"


DOC_COMMAND = re.compile(r"python benchmarks/(\w+)\.py([^`\n]*)")


@pytest.mark.usefixtures("benchmarks_importable")
def test_every_benchmark_command_the_docs_show_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    commands = [(page.name, *match.groups()) for page in pages
                for match in DOC_COMMAND.finditer(page.read_text())]  # fmt: skip
    assert commands, "the docs show no benchmark command"
    for page, name, rest in commands:
        assert name in COMMAND_LINES, f"{page} shows benchmarks/{name}.py, which is not kept"
        words = shlex.split(rest, comments=True)
        built_parser(script(name), monkeypatch).parse_args(words)
