"""Which environment to load and with what arguments (shared by orchestrator, SFT and eval)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from asyncrl.config.base import StrictModel, planned


class EnvConfig(StrictModel):
    id: str = Field(description="Environment id: a built-in name or `owner/some-env`.")
    name: str | None = Field(None, description="Human-readable name used in metrics.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for `load_environment`."
    )
    address: str | None = planned(
        None,
        "Address of an external environment server (null = load in process).",
        feature="external environment servers",
    )
