"""What a config names by import path (`package.module:function`): a custom advantage, a
reward, a weight transport. The code runs because the user wrote its path in the config, and
only then."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable

from asyncrl.config.base import ConfigError


def load_object(import_path: str) -> object:
    """`package.module:name` (or `package.module.name`) -> the object; a path that does not
    resolve is a config error naming the path and what went wrong."""
    module_name, _, attribute = import_path.replace(":", ".").rpartition(".")
    if not module_name:
        raise ConfigError(f"import path `{import_path}` must look like `package.module:name`")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"cannot import `{import_path}`: {error}") from error


def load_function(import_path: str) -> Callable[..., object]:
    """`package.module:function` -> the function (see `load_object`)."""
    function = load_object(import_path)
    if not callable(function):
        raise ConfigError(f"`{import_path}` is not callable")
    return function  # type: ignore[no-any-return]


def function_at(import_path: str) -> Callable[..., object]:
    """The function at `import_path`, imported on its first call, not now: a reward named in a
    config then runs only in the reward workers, and the orchestrator, which loads the same
    environment for its prompts, never executes the user's module. That the module can be
    found is checked now (without running it), so a typo is a config error at start-up."""
    module_name, _, attribute = import_path.replace(":", ".").rpartition(".")
    if not module_name or not attribute:
        raise ConfigError(f"import path `{import_path}` must look like `package.module:function`")
    top = module_name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        raise ConfigError(
            f"cannot import `{import_path}`: no module `{top}` (install it, or put its folder "
            "on PYTHONPATH, for the reward workers too)"
        )
    loaded: list[Callable[..., object]] = []

    def call(*args: object, **kwargs: object) -> object:
        if not loaded:
            loaded.append(load_function(import_path))
        return loaded[0](*args, **kwargs)

    call.__name__ = attribute
    return call
