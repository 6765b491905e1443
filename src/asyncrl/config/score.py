"""Configuration of `asyncrl score`: a handful of completions scored by an environment's reward,
before any training, the way a run scores them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from asyncrl.config.base import StrictModel
from asyncrl.config.env import EnvConfig
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.config.passthrough import checked_passthrough, passthrough_field

_RUN = OrchestratorConfig.model_fields  # a run's reward limits are this command's defaults


class ScoreConfig(StrictModel):
    env: EnvConfig = Field(
        description="The environment, as in `orchestrator.env[]`: `{id: jsonl, args: {path: "
        "data.jsonl, reward: my_rewards:score}}`."
    )
    split: Literal["train", "eval"] = Field("train", description="Which split's examples.")
    num_examples: int = Field(3, gt=0, description="How many examples to show and score.")
    completions: list[str] = Field(
        default_factory=lambda: ["{answer}", ""],
        description="Completions scored against every example; `{answer}` and `{<column>}` "
        "stand for the example's answer and its other columns (the default scores the answer "
        "itself and an empty completion: a working reward tells them apart).",
    )
    completions_file: str | None = Field(
        None,
        description='A JSONL file of `{"completion": ...}` lines (optionally `example`: the '
        "example's position, from 0), scored besides `completions`; e.g. your model's outputs.",
    )
    timeout: float = Field(
        _RUN["reward_timeout"].default,
        gt=0,
        description="Seconds one reward may take (a run's `orchestrator.reward_timeout`).",
    )
    memory_limit: float | None = Field(
        _RUN["reward_memory_limit"].default,
        gt=0,
        description="GiB of address space of the reward worker and its children, as in a run "
        "(`orchestrator.reward_memory_limit`; null = no limit).",
    )
    cpu_limit: float | None = Field(
        _RUN["reward_cpu_limit"].default,
        gt=0,
        description="CPU seconds one completion's reward may use, as in a run "
        "(`orchestrator.reward_cpu_limit`; null = no limit).",
    )
    env_passthrough: list[str] = passthrough_field(
        "the reward worker (as a run's `orchestrator.reward_env_passthrough`)"
    )

    @model_validator(mode="after")
    def _passthrough_holds_no_key(self) -> ScoreConfig:
        checked_passthrough(self.env_passthrough, [])
        return self
