"""The configuration reference page (`docs/config-reference.md`), generated from the pydantic
models' fields and descriptions, so the page cannot drift from the code: a test renders it
again and fails when the checked-in page differs.

    python -m asyncrl.config.reference > docs/config-reference.md
"""

from __future__ import annotations

import typing
from collections.abc import Iterable

from pydantic import BaseModel

from asyncrl.config.help import iter_fields
from asyncrl.config.loading import _inner_model

# `asyncrl infer|orch|train` take one section of `asyncrl rl` as their whole config
SECTION_COMMANDS = {"infer": "inference", "orch": "orchestrator", "train": "trainer"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_command(command: str, summary: str, model: type[BaseModel]) -> list[str]:
    lines = [f"## asyncrl {command}", "", summary, "", "| key | type | default | meaning |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for path, type_name, default, description in iter_fields(model):
        if type_name == "section":
            lines.append(f"| **`{path}`** | section | | {_cell(description)} |")
        else:
            lines.append(
                f"| `{path}` | `{_cell(type_name)}` | `{_cell(default)}` | {_cell(description)} |"
            )
    return [*lines, ""]


def render_reference(commands: Iterable[tuple[str, str, type[BaseModel]]]) -> str:
    """Markdown for every command's configuration: one table per command, rows in field order,
    nested sections expanded (`trainer.loss.type`), list members as `env[].id`."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from the code by `python -m asyncrl.config.reference`; do not edit by hand "
        "(a test fails when this page is out of date). How configs are written, merged and "
        "overridden: [configuration](configuration.md). "
        + ", ".join(
            f"`asyncrl {c}` takes the `{s}` section of `asyncrl rl`"
            for c, s in SECTION_COMMANDS.items()
        )
        + " as its whole config.",
        "",
    ]
    tables: list[str] = []
    for command, summary, model in commands:
        if command in SECTION_COMMANDS:
            lines += wired_sections(command, model)
        else:
            tables += render_command(command, summary, model)
    return "\n".join([*lines, *tables])


def wired_sections(command: str, model: type[BaseModel]) -> list[str]:
    """The keys a role's own config may give that `asyncrl rl` sets once for the run (so its
    table does not list them): one row each, with the one name to set under `asyncrl rl`."""
    rows = _wired_rows(model)
    if not rows:
        return []
    return [
        f"`asyncrl {command}` alone also takes these keys, which `asyncrl rl` sets once for the "
        "run:",
        "",
        f"| `asyncrl {command}` key | under `asyncrl rl` | description |",
        "|---|---|---|",
        *rows,
        "",
    ]


def _wired_rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        inner = _inner_model(field.annotation)
        if "wired" in extra:
            description = _cell(field.description or "")
            rows.append(f"| `{prefix}{name}` | `{extra['wired']}` | {description} |")
        elif inner is not None and typing.get_origin(field.annotation) is not list:
            rows += _wired_rows(inner, f"{prefix}{name}.")
    return rows


def main() -> None:
    from asyncrl.cli import COMMANDS  # the command table lives with the commands

    print(render_reference((name, c.summary, c.config) for name, c in COMMANDS.items()), end="")


if __name__ == "__main__":
    main()
