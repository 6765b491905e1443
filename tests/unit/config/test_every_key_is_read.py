"""Every configuration key is read by code outside the config package, or is a `planned` key
(accepted at its default so configs written for other systems load, refused when set — the
check that refuses it is what reads it). A key nothing reads would be a setting a user changes
to no effect. A key of `asyncrl rl` that the wiring copies into the roles' own keys
(`SHARED_FIELDS`, `OVERRIDES`) is read where those are.

The check is by name: a key counts as read where `.name`, `"name"` or `name=` appears in a
module outside `asyncrl/config/`. A key sharing its name with a read one can slip through; a key
whose name nothing mentions cannot."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from asyncrl.cli import COMMANDS
from asyncrl.config.loading import _models_in
from asyncrl.config.rl_wiring import OVERRIDES, SHARED_FIELDS

SRC = Path(__file__).resolve().parents[3] / "src" / "asyncrl"


def config_models(model: type[BaseModel], seen: set[type[BaseModel]]) -> Iterator[type[BaseModel]]:
    """`model` and every model nested in its fields (sections, list members, union members)."""
    if model in seen:
        return
    seen.add(model)
    yield model
    for field in model.model_fields.values():
        for inner in _models_in(field.annotation):
            yield from config_models(inner, seen)


def unread_keys(models: list[type[BaseModel]], sources: list[str]) -> list[str]:
    unread = []
    for model in models:
        for name, field in model.model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if "planned" in extra:
                continue
            names = {name} | copied_into(name)
            read = re.compile(
                rf"(\.({'|'.join(names)})\b|[\"']({'|'.join(names)})[\"']|\b({'|'.join(names)})=)"
            )
            if not any(read.search(text) for text in sources):
                unread.append(f"{model.__name__}.{name}")
    return unread


def copied_into(name: str) -> set[str]:
    """The role keys `asyncrl rl` copies a shared setting named `name` into."""
    paths = [p for shared, ps in SHARED_FIELDS.items() if shared.endswith(f".{name}") for p in ps]
    paths += [p for shared, p in OVERRIDES.items() if shared.endswith(f".{name}")]
    return {path[-1] for path in paths}


def test_every_key_of_every_command_is_read_outside_the_config_package() -> None:
    seen: set[type[BaseModel]] = set()
    models = [m for command in COMMANDS.values() for m in config_models(command.config, seen)]
    sources = [p.read_text() for p in SRC.rglob("*.py") if "config" not in p.relative_to(SRC).parts]
    assert len(models) > 20  # the walk reaches the nested sections
    unread = unread_keys(models, sources)
    assert not unread, f"keys no code reads: {unread}"


def test_a_key_nothing_reads_is_found() -> None:
    class Section(BaseModel):
        used_setting: int = 1
        forgotten_setting: int = 2

    assert unread_keys([Section], ["x = config.used_setting"]) == ["Section.forgotten_setting"]
