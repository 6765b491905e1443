"""The roles never import each other (the design's first rule): each runs as its own process,
so an import across them would tie their code, their start-up time and their failures together.
Code several roles need lives below them (`config`, `transport`, `web`, …); code that joins two
roles (`colocation`, `launch`) lives above them. The orchestrator may use the environments: they
are its library (the environment server serves the same ones)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "asyncrl"
ROLES = ("inference", "orchestrator", "trainer", "envs")
ALLOWED = {("orchestrator", "envs")}


def imported_packages(path: Path) -> set[str]:
    """The asyncrl subpackages a module imports, wherever the import statement is."""
    packages = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        packages |= {name.split(".")[1] for name in names if name.startswith("asyncrl.")}
    return packages


def test_no_role_imports_another_role() -> None:
    crossings = [
        f"{path.relative_to(SRC)} imports asyncrl.{other}"
        for role in ROLES
        for path in sorted((SRC / role).rglob("*.py"))
        for other in sorted(imported_packages(path))
        if other in ROLES and other != role and (role, other) not in ALLOWED
    ]
    assert not crossings, "\n".join(crossings)


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from asyncrl.inference.server import build_app\n")
    assert imported_packages(module) == {"inference"}
