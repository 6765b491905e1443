"""Configuration of `asyncrl score`: a handful of completions scored by an environment's reward,
before any training, the way a run scores them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.config.base import StrictModel
from asyncrl.config.env import EnvConfig


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
    timeout: float = Field(30.0, gt=0, description="Seconds one reward may take.")
