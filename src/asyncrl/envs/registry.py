"""Resolve an `env.id` to an environment: a built-in name, a reasoning-gym dataset
(`reasoning-gym/<dataset>`), a verifiers 0.4 environment (a taskset; `envs/verifiers/`), else
the rule of verifiers <= 0.3 (`owner/some-env` -> import module `some_env` ->
`load_environment(**args)`).

A verifiers 0.4 environment is not an asyncrl `Environment`: it plays its own episodes in worker
processes, and only `asyncrl rl` / `asyncrl orch` run it (`envs/remote.environment_of`). Here it
is recognised (`envs/verifiers/detect.py`, or after import by its exports) and refused with
`VerifiersEnvironmentFound`, which says so."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from asyncrl.config.base import ConfigError
from asyncrl.envs import (
    arithmetic,
    calculator,
    countdown,
    guess_number,
    jsonl_dataset,
    math_answers,
    reasoning_gym_tasks,
    reverse_text,
)
from asyncrl.envs.base import Environment
from asyncrl.envs.verifiers.detect import is_verifiers_environment

BUILTIN: dict[str, Callable[..., Any]] = {
    "reverse-text": reverse_text.load_environment,
    "arithmetic": arithmetic.load_environment,
    "countdown": countdown.load_environment,
    "math": math_answers.load_environment,
    "jsonl": jsonl_dataset.load_environment,
    "guess-number": guess_number.load_environment,
    "calculator": calculator.load_environment,
}


class EnvironmentLoadError(ConfigError):
    """The environment id or its arguments are wrong; the message says which (a config error:
    `asyncrl` exits with code 2, and a launcher does not restart a role for it)."""


class VerifiersEnvironmentFound(EnvironmentLoadError):
    """`env.id` names a verifiers 0.4 environment, which runs its own episodes: the orchestrator
    runs it (`asyncrl rl`, `asyncrl orch`); commands that score completions in-process do not."""

    def __init__(self, env_id: str) -> None:
        super().__init__(
            f"environment `{env_id}` is a verifiers environment: it plays its own episodes, so "
            "it runs under `asyncrl rl` or `asyncrl orch` (docs/environments.md), not here"
        )
        self.env_id = env_id


def load_environment(env_id: str, args: dict[str, Any] | None = None) -> Environment:
    args = args or {}
    if env_id.startswith(reasoning_gym_tasks.PREFIX):
        dataset = env_id.removeprefix(reasoning_gym_tasks.PREFIX)
        try:
            return reasoning_gym_tasks.load_reasoning_gym(dataset, **args)
        except (reasoning_gym_tasks.ReasoningGymError, TypeError) as error:
            raise EnvironmentLoadError(f"environment `{env_id}`: {error}") from error
    if env_id in BUILTIN:
        factory = BUILTIN[env_id]
    elif is_verifiers_environment(env_id):
        raise VerifiersEnvironmentFound(env_id)
    else:
        module_name = env_id.split("/")[-1].replace("-", "_")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            raise EnvironmentLoadError(
                f"environment `{env_id}`: not built in ({', '.join(BUILTIN)}) and module "
                f"`{module_name}` is not installed ({error})"
            ) from error
        factory = getattr(module, "load_environment", None)
        if factory is None and exports_verifiers_environment(module):
            raise VerifiersEnvironmentFound(env_id)
        if factory is None:
            raise EnvironmentLoadError(
                f"environment `{env_id}`: `{module_name}` has no load_environment"
            )
    try:
        return factory(**args)
    except TypeError as error:
        raise EnvironmentLoadError(
            f"environment `{env_id}`: bad args {args!r} ({error})"
        ) from error
    except ValueError as error:  # a data file, a reward path: said in one line, not retried
        if isinstance(error, EnvironmentLoadError):
            raise
        raise EnvironmentLoadError(f"environment `{env_id}`: {error}") from error


def exports_verifiers_environment(module: ModuleType) -> bool:
    """`module` (imported) exports a verifiers `Taskset` or `Env` subclass in `__all__`."""
    if "verifiers" not in sys.modules:  # it imported no verifiers: not one of its environments
        return False
    import verifiers.v1 as vf

    exported = [getattr(module, name, None) for name in getattr(module, "__all__", [])]
    return any(isinstance(obj, type) and issubclass(obj, vf.Taskset | vf.Env) for obj in exported)
