"""A verifiers environment as asyncrl runs it: its config with asyncrl's defaults, and what is
refused at start-up, each with its reason (never a traceback mid-run). Runs in the worker.

Defaults (only where the environment and the user leave a choice open):
- a seat's runtime is `subprocess` (verifiers' default is Prime's remote sandbox);
- a seat's harness is `asyncrl-chat` when the taskset ships none (verifiers' default, `bash`,
  runs model-written shell commands on this machine).

Refused, with the reason:
- container runtimes (docker, podman, apptainer) and remote sandboxes (prime, modal, e2b), for
  a seat or a tool server, and tasks that need a container (`NEEDS_CONTAINER`, an `image`);
- harnesses that install a third-party agent (`NEEDS_CONTAINER`: the coding agents,
  browser_use); `bash` unless `allow_host_commands`; `null` without `uv` on PATH;
- environments with more than one seat, and `best-of-n` (GRPO groups one trainable trace per
  episode);
- endpoints off this machine: judges, a seat's own client, a tool server `url`, an OpenEnv
  `base_url`; and an OpenEnv `env` id or `use_docker` (a download, a container);
- a taskset that fails to load, or a renderer that cannot be built for the model.
"""

from __future__ import annotations

import copy
import shutil
from typing import Any
from urllib.parse import urlparse

from verifiers.v1.configs.agent import agent_config_fields
from verifiers.v1.configs.env import default_agent_harness
from verifiers.v1.runtimes import PrimeConfig, SubprocessConfig
from verifiers.v1.utils.loaders import (
    environment_class,
    load_harness,
    resolve_env_config,
    taskset_class,
)

from asyncrl.envs.verifiers.chat_harness import HARNESS_ID, ChatHarnessConfig
from asyncrl.run_secret import is_loopback

CONTAINERS = {"docker", "podman", "apptainer"}
MULTI_TRACE_ENVS = {"best-of-n", "best_of_n"}


class Refusal(Exception):
    """The environment cannot run here; the message says why and what to change."""


def runtime_problem(runtime: Any, what: str) -> str | None:
    kind = getattr(runtime, "type", "?")
    if kind == "subprocess":
        return None
    if kind in CONTAINERS:
        return (
            f"{what} asks for the `{kind}` runtime: container runtimes are not supported "
            "(asyncrl runs environments in its own worker processes, on this machine)"
        )
    return (
        f"{what} asks for the `{kind}` runtime: remote sandboxes need accounts, keys and "
        "network access, which a training run here does not have"
    )


def off_machine(url: str | None) -> bool:
    return bool(url) and not is_loopback(urlparse(url).hostname or "")


def env_config(
    env_id: str, args: dict[str, Any], allow_host_commands: bool
) -> tuple[Any, list[str]]:
    """The verifiers env config for `env_id` with `args` (its env config, the taskset's id
    set from `env_id`) and asyncrl's defaults, and notes on what the defaults changed. Raises
    `Refusal`."""
    data = copy.deepcopy(args)
    taskset = dict(data.get("taskset") or {})
    taskset["id"] = env_id
    data["taskset"] = taskset
    notes: list[str] = []
    try:
        config = resolve_env_config(data)
    except Exception as error:  # the user's config, validated by verifiers: said in one line
        raise Refusal(f"its config does not validate: {error}") from None
    if config.id in MULTI_TRACE_ENVS:
        raise Refusal(
            f"env `{config.id}` plays several trainable attempts per episode; GRPO "
            "groups one trainable trace per episode: use the taskset alone"
        )
    seats = agent_config_fields(config)
    if len(seats) != 1:
        raise Refusal(
            f"it has {len(seats)} seats ({', '.join(seats)}); GRPO groups one "
            "trainable trace per episode, so multi-seat environments are not "
            "supported yet"
        )
    ((name, seat),) = seats.items()
    updates: dict[str, Any] = {}
    if isinstance(seat.runtime, PrimeConfig) and "runtime" not in seat.model_fields_set:
        updates["runtime"] = SubprocessConfig()
    elif problem := runtime_problem(seat.runtime, f"seat `{name}`"):
        raise Refusal(problem)
    harness = seat.harness if seat.harness is not None else default_agent_harness(env_id)
    if seat.harness is None and harness.id == "bash":
        updates["harness"] = ChatHarnessConfig()
        notes.append(
            f"seat `{name}`: the taskset ships no harness; asyncrl's `{HARNESS_ID}` "
            "plays it (verifiers' default `bash` runs model-written commands)"
        )
    else:
        check_harness(harness, f"seat `{name}`", allow_host_commands)
    if seat.client is not None and off_machine(getattr(seat.client, "base_url", None)):
        raise Refusal(
            f"seat `{name}` calls its own model at {seat.client.base_url}: a trained "
            "seat is played by the run's policy"
        )
    if updates:
        seat = seat.model_copy(update=updates)
        config = config.model_copy(update={name: seat})
    check_taskset(config)
    return config, notes


def check_harness(config: Any, where: str, allow_host_commands: bool) -> None:
    try:
        harness = load_harness(config)
    except Exception as error:
        raise Refusal(f"{where}: harness `{config.id}` cannot be loaded: {error}") from None
    if harness.NEEDS_CONTAINER:
        raise Refusal(
            f"{where}: harness `{config.id}` installs and drives a third-party agent, "
            "which needs a container runtime (not supported here)"
        )
    if config.id == "bash" and not allow_host_commands:
        raise Refusal(
            f"{where}: harness `bash` runs the commands the model writes on this "
            "machine; set `verifiers.allow_host_commands: true` to allow it"
        )
    if config.id in ("null", "bash") and shutil.which("uv") is None:
        raise Refusal(
            f"{where}: harness `{config.id}` runs its program with `uv`, which is not "
            f"on PATH (`pip install uv`), or use `{HARNESS_ID}`"
        )


def check_taskset(config: Any) -> None:
    """What the taskset, its task class and its tool servers ask for."""
    env_cls = environment_class(config.taskset.id, config.id)
    taskset_cls = taskset_class(config.taskset.id)
    task_cls = taskset_cls.task_type()
    if task_cls.NEEDS_CONTAINER:
        raise Refusal(
            f"its tasks ({task_cls.__name__}) need a container runtime (not supported here)"
        )
    servers = [*task_cls.toolsets(config.taskset.task), *taskset_cls.toolsets(config.taskset)]
    for server in servers:
        what = f"tool server `{getattr(server, 'server_name', type(server).__name__)}`"
        if off_machine(getattr(server.config, "url", None)):
            raise Refusal(f"{what} is at {server.config.url}, off this machine")
        if problem := runtime_problem(getattr(server.config, "runtime", SubprocessConfig()), what):
            raise Refusal(problem)
    for judge in config.taskset.task.judges:
        if off_machine(judge.base_url):
            raise Refusal(
                f"judge `{judge.name or judge.id}` calls {judge.base_url}: judges off "
                "this machine are not supported (a judge may be an asyncrl server on "
                "127.0.0.1, or use `model_rewards`)"
            )
    if env_cls.__name__ == "OpenEnvEnv" or config.taskset.id == "openenv":
        taskset = config.taskset
        if getattr(taskset, "env", None) or getattr(taskset, "use_docker", False):
            raise Refusal(
                "OpenEnv's `env` (a download) and `use_docker` are not supported: "
                "start the OpenEnv server yourself and give its `base_url`"
            )
        if off_machine(getattr(taskset, "base_url", None)):
            raise Refusal(f"the OpenEnv server {taskset.base_url} is off this machine")


def check_task(data: Any) -> str | None:
    """Why one task cannot run here (None: it can)."""
    if getattr(data, "image", None):
        return f"task {data.name or data.id or data.idx} needs the container image {data.image}"
    return None


def reward_weights(task: Any) -> dict[str, float]:
    """The task's reward functions (decorated and plugged) and their weights."""
    return {fn.__name__: float(getattr(fn, "_vf_weight", 1.0)) for fn in task.hooks("reward")}
