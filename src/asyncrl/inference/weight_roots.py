"""Which directories a server may read weights from (`inference.weight_roots`): a path from a
request is resolved (symlinks, `..`) and must lie under one of them. Without torch, so vLLM's
worker extension and `asyncrl infer` (as vLLM's parent) check paths the same way the embedded
server does (`weights.py`)."""

from __future__ import annotations

from pathlib import Path


class WeightLoadError(ValueError):
    """The directory is missing, outside the allowed roots, or does not fit the model."""


def resolve_under_roots(path: str | Path, roots: list[str]) -> Path:
    """The real path of `path` (symlinks resolved), which must lie under one of `roots`.

    A path from a request is taken literally: `~user` is not expanded, so a client can neither
    probe which users exist nor make the lookup fail.
    """
    if "\x00" in str(path):
        raise WeightLoadError(f"{path!r}: a path cannot contain NUL")
    resolved = Path(path).resolve()
    for root in roots:
        root_path = Path(root).expanduser().resolve()
        if resolved == root_path or root_path in resolved.parents:
            return resolved
    raise WeightLoadError(
        f"{path}: outside the allowed weight roots {roots} (set inference.weight_roots)"
    )


def resolved_roots(roots: list[str]) -> list[str]:
    """`roots` as absolute real paths, fixed where the server starts (its working directory)."""
    return [str(Path(root).expanduser().resolve()) for root in roots]
