"""Resolve an `env.id` to an environment: a built-in name, a reasoning-gym dataset
(`reasoning-gym/<dataset>`), else the `verifiers` rule (`owner/some-env` -> import module
`some_env` -> `load_environment(**args)`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
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
