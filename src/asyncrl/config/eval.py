"""Configuration of `asyncrl eval`: score a model on an environment's held-out split."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from asyncrl.config.base import StrictModel
from asyncrl.config.env import EnvConfig, rubric_only


class EvalRunConfig(StrictModel):
    model: str = Field(
        description="Model to score: a Hugging Face id or directory, an RL broadcast "
        "(`…/broadcasts/step_N`, full weights or a LoRA adapter), or a run directory (every "
        "broadcast in it, in step order)."
    )
    models: list[str] = Field(
        default_factory=list, description="More models to score in the same call, as `model`."
    )
    base_model: str | None = Field(
        None,
        description="Base weights under a LoRA adapter (null = the adapter's "
        "`base_model_name_or_path`).",
    )
    tokenizer: str | None = Field(
        None,
        description="Tokenizer location (null = the model's, or the base model's for an adapter).",
    )
    metrics_file: str | None = Field(
        None, description="Append the `eval/<env>/…` records here (a run's metrics.jsonl)."
    )
    pass_threshold: float = Field(
        1.0, description="Reward at which a sample counts as solved, for pass@k."
    )
    env: EnvConfig = Field(
        default_factory=lambda: EnvConfig(id="reverse-text"), description="Environment."
    )
    num_examples: int = Field(256, gt=0, description="Held-out examples to score.")
    rollouts_per_example: int = Field(1, gt=0, description="Samples per example.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0 = greedy).")
    max_tokens: int = Field(64, gt=0, description="Max new tokens per completion.")
    batch_size: int = Field(64, gt=0, description="(generator: hf) Prompts generated together.")
    generator: Literal["hf", "engine"] = Field(
        "hf",
        description="What samples the completions, in this process: `hf`, one batched "
        "`model.generate` per `batch_size` prompts (independent of asyncrl's engine); `engine`, "
        "the embedded engine that `asyncrl rl` serves, every prompt in one continuous batch "
        "(faster; single-turn environments).",
    )
    seed: int = Field(0, description="Sampling seed.")
    trust_remote_code: bool = Field(False, description="Allow custom model code from the hub.")

    @field_validator("env")
    @classmethod
    def _rubric_only(cls, env: EnvConfig) -> EnvConfig:
        return rubric_only(env, "`asyncrl eval` scores with the environment's own rubric")
