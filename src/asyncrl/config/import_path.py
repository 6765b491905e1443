"""What a config names by import path (`package.module:function`): a custom advantage, a
reward, a weight transport. The code runs because the user wrote its path in the config, and
only then."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import subprocess
import sys
from collections.abc import Callable

from asyncrl.config.base import ConfigError
from asyncrl.user_code import start_user_code, user_code_environment


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


def function_at(import_path: str, key: str = "reward") -> Callable[..., object]:
    """The function at `import_path` (the value of config key `key`), imported on its first
    call, not now: a reward named in a config then runs only in the reward workers, and the
    orchestrator, which loads the same environment for its prompts, never executes the user's
    module. That the function exists is checked now, so a typo is a config error at start-up:
    the module can be found (without running it), and a short-lived Python process, which may
    run it, finds the attribute (`check_function_elsewhere`); a process that runs user code
    anyway (a reward worker, `user_code_runs_here`) imports it itself."""
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
    if _user_code_runs_here:
        loaded.append(load_function(import_path))
    else:
        check_function_elsewhere(import_path, key)

    def call(*args: object, **kwargs: object) -> object:
        if not loaded:
            loaded.append(load_function(import_path))
        return loaded[0](*args, **kwargs)

    call.__name__ = attribute
    return call


_user_code_runs_here = False
CHECK_TIMEOUT_S = 120.0  # importing a user's module (torch, say) may take a while; not for ever
_CHECK = """
import importlib, sys
path = sys.argv[1]
def say(message):
    print(" ".join(message.split())[:2000])
module_name, _, attribute = path.replace(":", ".").rpartition(".")
try:
    module = importlib.import_module(module_name)
except BaseException as error:
    say(f"importing `{module_name}` failed: {type(error).__name__}: {error}")
    sys.exit(3)
if not hasattr(module, attribute):
    public = sorted(n for n in vars(module) if callable(getattr(module, n)) and n[0] != "_")
    say(f"module `{module_name}` has no attribute `{attribute}` (its functions: "
        f"{', '.join(public[:20]) or 'none'})")
    sys.exit(3)
if not callable(getattr(module, attribute)):
    say(f"`{attribute}` in `{module_name}` is not callable")
    sys.exit(3)
"""


def user_code_is_here() -> bool:
    """Whether this process runs the user's code anyway (see `user_code_runs_here`)."""
    return _user_code_runs_here


def user_code_runs_here() -> None:
    """This process runs the user's code anyway (a reward worker): `function_at` imports it
    at once, so a missing function fails the worker's start, and no checking process is made."""
    global _user_code_runs_here
    _user_code_runs_here = True


@functools.cache
def check_function_elsewhere(import_path: str, key: str) -> None:
    """ConfigError naming `key` and the attribute unless a fresh Python process, started as a
    reward worker is (same interpreter, working directory and PYTHONPATH; the run's secrets
    left out), imports `import_path`'s module and finds a callable there. Once per path."""
    run_elsewhere(_CHECK, import_path, key)


def run_elsewhere(script: str, import_path: str, key: str) -> str:
    """Run `script` (given `import_path` as its argument) in a short-lived Python process as a
    reward worker is started (same interpreter, working directory and PYTHONPATH; the run's
    secrets left out), so that the user's module is imported there and never here; its last
    line of output, or a ConfigError naming `key` with what it said when it exits non-zero."""
    try:  # started as a reward worker is (`user_code.py`)
        checked = subprocess.run(
            [sys.executable, "-c", script, import_path], env=user_code_environment(),
            capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL,
            preexec_fn=start_user_code,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"`{key}: {import_path}`: importing its module took longer than "
            f"{CHECK_TIMEOUT_S:.0f} s (checked in a separate process at start-up)"
        ) from None
    said = checked.stdout.strip().splitlines()[-1:] or [checked.stderr.strip()[-500:]]
    if checked.returncode != 0:
        raise ConfigError(f"`{key}: {import_path}`: {said[0]}")
    return said[0] if said else ""
