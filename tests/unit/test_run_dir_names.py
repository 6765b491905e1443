"""A run directory's names are written once, in `asyncrl/run/layout.py`: a writer and a reader in
different processes agree on them only if both take them from there. A name of the layout typed
as a string anywhere else in the package fails here, with the constant or function to use."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from asyncrl.run import layout

SRC = Path(__file__).resolve().parents[2] / "src" / "asyncrl"
LAYOUT = "run/layout.py"

# Files that still spell names out, each converting to the layout in its own change; the list
# only shrinks (a file that no longer needs its entry fails `test_the_allow_list_only_shrinks`).
NOT_YET_CONVERTED: set[str] = set()

# Words that mean something else too (a tracker, a table's key): a name only as a path part.
COMMON_WORDS = {layout.SAMPLES_DIR, layout.LOGS_DIR, layout.CONFIGS_DIR, layout.TENSORBOARD_DIR}
NAMES = {
    value: name
    for name, value in vars(layout).items()
    if name.isupper() and isinstance(value, str) and name != "DEFAULT_RUN_NAME"  # "default"
} | {
    layout.RUN_DIR_PREFIX + layout.DEFAULT_RUN_NAME: "run_dir(output_dir)",
    layout.RUN_DIR_PREFIX + "*": "find_run_dir / run_name_of (no run is looked for)",
}


def literal_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every layout name written as a string: anywhere for a name that means
    nothing else, as an operand of `/` for a common word."""
    path_parts = {
        id(side)
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
        for side in (node.left, node.right)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in NAMES
        and (node.value not in COMMON_WORDS or id(node) in path_parts)
    ]


@functools.cache
def sites() -> dict[str, list[tuple[int, str]]]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        names = literal_names(ast.parse(path.read_text(), filename=str(path)))
        if names and module != LAYOUT:
            found[module] = names
    return found


def test_no_run_directory_name_is_spelled_outside_the_layout() -> None:
    spelled = [
        f"src/asyncrl/{module}:{line}: {value!r} -> asyncrl.run.layout.{NAMES[value]}"
        for module, names in sites().items()
        if module not in NOT_YET_CONVERTED
        for line, value in names
    ]
    assert not spelled, "\n".join(spelled)


def test_the_allow_list_only_shrinks() -> None:
    converted = sorted(NOT_YET_CONVERTED - set(sites()))
    assert not converted, f"no names left in {converted}: remove them from NOT_YET_CONVERTED"


def test_the_scan_sees_names_and_path_parts_but_not_other_uses_of_common_words() -> None:
    tree = ast.parse(
        'a = run / "metrics.jsonl"\n'
        'b = {"samples": table}\n'
        'c = run / "samples"\n'
        'd = "the samples of a step"\n'
        'e = f"{run}/x" if ok else "FINISHED"\n'
    )
    assert literal_names(tree) == [(1, "metrics.jsonl"), (3, "samples"), (5, "FINISHED")]
