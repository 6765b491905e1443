"""Which environment to load and with what arguments (shared by orchestrator, SFT and eval)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from asyncrl.config.base import StrictModel
from asyncrl.config.model_rewards import ModelRewardConfig
from asyncrl.config.verifiers import VerifiersConfig


class EnvConfig(StrictModel):
    id: str = Field(
        description="Environment id: a built-in name, `reasoning-gym/<dataset>`, or "
        "`owner/some-env` (a module with `load_environment`, or a verifiers taskset)."
    )
    name: str | None = Field(None, description="Human-readable name used in metrics.")
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for `load_environment`; for a verifiers environment, "
        "its env config (`taskset`, the seat `agent`...; the taskset id is `id`).",
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
    verifiers: VerifiersConfig | None = Field(
        None,
        description="How a verifiers environment is run (found by `id` without it; set it to "
        "change the defaults).",
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
