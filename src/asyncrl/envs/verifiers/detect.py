"""Whether an `env.id` names a verifiers (0.4) environment, decided without running its code.

verifiers 0.4 resolves an id as `loaders._import_plugin` does: drop an `owner/` prefix and an
`@version` suffix, `-` to `_`, lower case, then `verifiers.v1.tasksets.<name>` (its built-in
adapters: OpenEnv, TextArena...) before a top-level module `<name>`; the module exports a
`Taskset` (and maybe an `Env`) subclass in `__all__`. It has no `load_environment`: that is
verifiers <= 0.3's convention, which asyncrl's registry keeps for modules that define it.

The orchestrator holds the run's secret, and a verifiers environment's code (its taskset, tools
and rewards) runs only in worker processes that do not, so this reads the module's source
instead of importing it: a module that imports `verifiers` and defines no `load_environment` is
a verifiers environment. (The registry imports a module it cannot classify this way and looks
again: a package whose `__init__` only re-exports.)
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

TASKSETS = "verifiers.v1.tasksets"


def module_name(env_id: str) -> str:
    """The module verifiers imports for `env_id`."""
    return env_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def builtin_taskset(env_id: str) -> str | None:
    """`verifiers.v1.tasksets.<name>` when verifiers is installed and ships that adapter, found
    on disk without importing verifiers (its import takes seconds)."""
    try:
        spec = importlib.util.find_spec("verifiers")
    except (ImportError, ValueError):
        return None
    name = module_name(env_id)
    for root in (spec.submodule_search_locations or []) if spec else []:
        base = Path(root) / "v1" / "tasksets" / name
        if base.is_dir() or base.with_suffix(".py").is_file():
            return f"{TASKSETS}.{name}"
    return None


def imports_verifiers_without_load_environment(module: str) -> bool | None:
    """True: `module`'s source imports verifiers and defines or imports no `load_environment`;
    False: it does not; None: no readable source (not installed, compiled, a namespace)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(spec.origin).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    imports_verifiers = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports_verifiers |= any(a.name.split(".")[0] == "verifiers" for a in node.names)
            if any((a.asname or a.name) == "load_environment" for a in node.names):
                return False
        elif isinstance(node, ast.ImportFrom):
            imports_verifiers |= (node.module or "").split(".")[0] == "verifiers"
            if any((a.asname or a.name) == "load_environment" for a in node.names):
                return False
        elif (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name == "load_environment"
            and node in tree.body
        ):
            return False
    return imports_verifiers


def is_verifiers_environment(env_id: str) -> bool:
    """`env_id` names a verifiers 0.4 environment (its adapters or a module per the rule above)."""
    if builtin_taskset(env_id) is not None:
        return True
    return bool(imports_verifiers_without_load_environment(module_name(env_id)))
