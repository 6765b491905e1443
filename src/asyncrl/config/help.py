"""`asyncrl <command> --help`: every config field with its type, default and description."""

from __future__ import annotations

import shutil
import textwrap
import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from asyncrl.config.loading import _inner_model, _models_in


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(str(arg) for arg in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is not None:
        args = ", ".join(_type_name(arg) for arg in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def iter_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """(key path, type, default, description) for every leaf field, nested sections expanded;
    a wired section (`config.base.wired`) only where its model stands alone (no `prefix`)."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if prefix and "wired" in extra:
            continue
        annotation = field.annotation
        inner = _inner_model(annotation)
        is_list = typing.get_origin(annotation) is list
        if inner is not None:
            yield path, "section", "", field.description or ""
            members = _models_in(annotation) if is_list else [inner]
            for member in members:
                yield from iter_fields(member, f"{path}[]." if is_list else f"{path}.")
            continue
        if field.is_required():
            default = "(required)"
        elif field.default is PydanticUndefined:
            default = repr(field.get_default(call_default_factory=True))
        else:
            default = repr(field.default)
        description = field.description or ""
        if "planned" in extra:
            description += f" [not supported yet: {extra['planned']}]"
        yield path, _type_name(annotation), default, description


def render_help(command: str, model: type[BaseModel], summary: str) -> None:
    """Plain text, so it reads the same in a narrow terminal, a pipe or a log."""
    width = shutil.get_terminal_size((100, 24)).columns
    print(
        f"usage: asyncrl {command} [CONFIG.yaml|toml ...] [--key.path VALUE ...] [--print-config]"
    )
    print(f"\n{summary}\n")
    print(
        textwrap.fill(
            "Config files merge left to right; `--key.path VALUE` overrides any field (VALUE is "
            "read as YAML: 0.01, true, null, [a, b]). `--print-config` prints the merged config.",
            width,
        )
    )
    print("\nfields:")
    for path, type_name, default, description in iter_fields(model):
        if type_name == "section":
            print(f"\n  {path}: {description}")
            continue
        print(f"  --{path}  ({type_name}; default {default})")
        print(textwrap.fill(description, width, initial_indent=" " * 6, subsequent_indent=" " * 6))
