"""Which environment to load and with what arguments (shared by orchestrator, SFT and eval)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from asyncrl.config.base import StrictModel
from asyncrl.config.model_rewards import ModelRewardConfig


class EnvConfig(StrictModel):
    id: str = Field(description="Environment id: a built-in name or `owner/some-env`.")
    name: str | None = Field(None, description="Human-readable name used in metrics.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for `load_environment`."
    )
    address: str | None = Field(
        None,
        description="URL of an `asyncrl env-server` serving this environment (null = load it "
        "here); `id` and `args` are then the server's business.",
    )
    api_key_var: str = Field(
        "ASYNCRL_ENV_API_KEY",
        description="Environment variable with the API key of the environment server.",
    )
    model_rewards: list[ModelRewardConfig] = Field(
        default_factory=list,
        description="Reward terms that are models, beside the environment's own rubric: "
        "`reward_model`, `judge` or `plugin` entries, each with its name and weight "
        "(docs/judges.md). Run by the orchestrator.",
    )


def rubric_only(env: EnvConfig, command: str) -> EnvConfig:
    """`env` unchanged, or the reason a command that scores in-process refuses its model terms
    (the orchestrator runs them: `envs/model_rewards/`)."""
    if env.model_rewards:
        names = ", ".join(term.name for term in env.model_rewards)
        raise ValueError(
            f"`model_rewards` ({names}) are scored by the orchestrator (`asyncrl rl`, `asyncrl "
            f"orch` and its online eval); {command}"
        )
    return env
