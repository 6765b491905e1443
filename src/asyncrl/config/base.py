"""Building blocks shared by every config model: strictness, planned keys, errors."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticUndefined


class ConfigError(ValueError):
    """A configuration a user wrote is wrong; the message names the key path and what is allowed."""


class StrictModel(BaseModel):
    """Unknown keys are errors, and assignments are validated like loading is."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


def _minus_one_is_no_limit(value: Any) -> Any:
    return None if value == -1 else value


# A step count where null means "no limit". The seeds spell that -1 in some files; it is read
# as null, so every role holds one spelling.
StepLimit = Annotated[Annotated[int, Field(gt=0)] | None, BeforeValidator(_minus_one_is_no_limit)]


def planned(default: Any, description: str, *, feature: str, **kwargs: Any) -> Any:
    """A key whose feature is not built yet.

    It exists so that configs written for comparable systems load, but setting it to anything
    other than its default stops start-up (see `check_planned`) instead of being ignored.
    """
    return Field(default, description=description, json_schema_extra={"planned": feature}, **kwargs)


def wired(default: Any = PydanticUndefined, *, description: str, source: str, **kwargs: Any) -> Any:
    """A key or section a launcher fills from another one (`source`), so a role's own config
    file can still give it. Inside a config that holds `source` too (`asyncrl rl`), it is not
    listed again (`--help`, the reference): `source` is the one place to set it there."""
    return Field(default, description=description, json_schema_extra={"wired": source}, **kwargs)


def check_planned(model: BaseModel, prefix: str = "") -> None:
    """Raise ConfigError for the first planned key that is set away from its default."""
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        path = f"{prefix}{name}"
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if "planned" in extra and value != field.get_default(call_default_factory=True):
            shown = (
                value.model_dump(exclude_defaults=True) if isinstance(value, BaseModel) else value
            )
            raise ConfigError(
                f"`{path}` is not supported yet ({extra['planned']}); "
                f"got {shown!r}, leave it at its default {field.get_default()!r}"
            )
        if isinstance(value, BaseModel):
            check_planned(value, f"{path}.")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, BaseModel):
                    check_planned(item, f"{path}[{index}].")
