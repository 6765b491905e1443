"""Load a config from files (YAML or TOML, merged left to right) and command-line overrides.

`load_config(Model, ["a.yaml", "b.toml"], ["--trainer.loss.kl_tau", "0.01"])` returns a
validated model or raises ConfigError whose message names each bad key path, the value given
and what is allowed.
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from asyncrl.config.base import ConfigError, check_planned

ModelT = TypeVar("ModelT", bound=BaseModel)

CONFIG_SUFFIXES = (".yaml", ".yml", ".toml")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """One YAML or TOML file as a dict; errors name the file."""
    path = Path(path)
    if path.suffix not in CONFIG_SUFFIXES:
        raise ConfigError(f"{path}: config files must end in {', '.join(CONFIG_SUFFIXES)}")
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"{path}: cannot read config file ({error.strerror})") from error
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as error:
        raise ConfigError(f"{path}: not valid {path.suffix[1:].upper()}: {error}") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of keys, got {type(data).__name__}"
        )
    return data


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; any other value (lists included) is replaced whole."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def parse_override_value(text: str) -> Any:
    """A command-line value read as a YAML scalar or flow collection: `0.01`, `null`, `[a, b]`."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """`--a.b.c value`, `--a.b.c=value`, or a bare `--flag` (true) as a nested dict."""
    overrides: dict[str, Any] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(
                f"unexpected argument {arg!r}: overrides look like `--key.path value`"
            )
        key, has_value, value_text = arg[2:].partition("=")
        if not has_value:
            following = args[index + 1] if index + 1 < len(args) else None
            if following is None or following.startswith("--"):
                value_text = "true"
            else:
                value_text = following
                index += 1
        index += 1
        parts = [part.replace("-", "_") for part in key.split(".")]
        if not all(parts):
            raise ConfigError(f"bad key path {key!r} in {arg!r}")
        node = overrides
        for part in parts[:-1]:
            existing = node.setdefault(part, {})
            if not isinstance(existing, dict):
                raise ConfigError(f"`{key}` is set both as a value and as a section")
            node = existing
        node[parts[-1]] = parse_override_value(value_text)
    return overrides


def split_files_and_overrides(args: list[str]) -> tuple[list[str], list[str]]:
    """Leading arguments that are config files, then the overrides."""
    files: list[str] = []
    for index, arg in enumerate(args):
        if arg.startswith("--"):
            return files, args[index:]
        files.append(arg)
    return files, []


PRINT_CONFIG = "--print-config"


def load_command_config(model: type[ModelT], args: list[str]) -> ModelT:
    """The validated config of `asyncrl <command> ARGS`, built as the command builds it before
    it runs anything (its `--print-config` flag aside): leading config files, then overrides.
    The docs' commands are checked through it (tests/unit/test_doc_commands.py)."""
    files, overrides = split_files_and_overrides([arg for arg in args if arg != PRINT_CONFIG])
    return load_config(model, files, overrides)


def load_config(
    model: type[ModelT], files: list[str] | None = None, overrides: list[str] | None = None
) -> ModelT:
    data: dict[str, Any] = {}
    for path in files or []:
        data = deep_merge(data, read_config_file(path))
    data = deep_merge(data, parse_overrides(overrides or []))
    return validate_config(model, data)


def validate_config(model: type[ModelT], data: dict[str, Any]) -> ModelT:
    try:
        config = model.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(model, error)) from None
    check_planned(config)
    return config


def _key_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Every BaseModel inside an annotation (`X | None`, `list[X]`, a union of X and Y)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in getattr(annotation, "__args__", ()):
        found.extend(_models_in(arg))
    return found


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    models = _models_in(annotation)
    return models[0] if models else None


def _field_names_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Names of the fields of the sub-model that `loc` points into (for "did you mean").

    A discriminated union (filters) puts its tag, such as `gibberish`, into the location; it
    selects the union member whose `type` default is that tag.
    """
    candidates = [model]
    for part in loc:
        if isinstance(part, int):
            continue
        following: list[type[BaseModel]] = []
        for candidate in candidates:
            field = candidate.model_fields.get(str(part))
            if field is not None:
                following.extend(_models_in(field.annotation))
            elif getattr(candidate.model_fields.get("type"), "default", None) == part:
                following.append(candidate)
        candidates = following
    return list(candidates[0].model_fields) if len(candidates) == 1 else []


def format_validation_error(model: type[BaseModel], error: ValidationError) -> str:
    lines = [f"invalid configuration ({error.error_count()} error(s)):"]
    for item in error.errors():
        raw_loc = tuple(item["loc"])
        loc = tuple(part for part in raw_loc if not _is_union_tag(model, raw_loc, part))
        path = _key_path(loc)
        kind = item["type"]
        message = item["msg"].removeprefix("Value error, ")
        if not path:
            lines.append(f"  {message}")
        elif kind == "extra_forbidden":
            known = _field_names_at(model, raw_loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f"; did you mean `{_key_path((*loc[:-1], close[0]))}`?" if close else ""
            lines.append(f"  `{path}`: unknown key{hint}")
        elif kind == "missing":
            lines.append(f"  `{path}`: required, not set")
        else:
            given = item.get("input")
            got = "" if isinstance(given, dict) else f" (got {given!r})"
            lines.append(f"  `{path}`: {message}{got}")
    return "\n".join(lines)


def _is_union_tag(model: type[BaseModel], loc: tuple[int | str, ...], part: int | str) -> bool:
    """Whether `part` in `loc` is a discriminated-union tag rather than a key the user wrote."""
    index = loc.index(part)
    return (
        isinstance(part, str)
        and part not in _field_names_at(model, loc[:index])
        and bool(_field_names_at(model, loc[: index + 1]))
    )
