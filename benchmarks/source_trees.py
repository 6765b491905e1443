"""Source trees run side by side by a benchmark (`--trees OLD/src NEW/src`): each tree checked
before any round, and each round checked to have run the tree it was given.

A child process runs a tree by putting it first on PYTHONPATH. A path without the package (a
typo, a worktree not yet made) would let `import asyncrl` fall through to the installed
checkout, and the benchmark would time the same code twice and report a ratio near 1.
"""

from __future__ import annotations

from pathlib import Path


def checked_trees(trees: list[str], benchmark: str) -> list[Path]:
    """The trees, resolved; stops with their names where one has no `asyncrl` package."""
    resolved = [Path(tree).resolve() for tree in trees]
    missing = [str(tree) for tree in resolved if not (tree / "asyncrl" / "__init__.py").is_file()]
    if missing:
        raise SystemExit(f"{benchmark}: no asyncrl package under {', '.join(missing)}")
    return resolved


def imported_from() -> str:
    """(in a child) Where this process imported asyncrl from: what `check_imported` reads."""
    import asyncrl

    return asyncrl.__file__ or ""


def check_imported(tree: Path, path: str, benchmark: str) -> None:
    """Stops where a child given `tree` imported asyncrl from somewhere else (`path`)."""
    if not Path(path).resolve().is_relative_to(tree):
        raise SystemExit(f"{benchmark}: {tree} ran asyncrl from {path}")
