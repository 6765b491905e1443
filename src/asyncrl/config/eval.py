"""Configuration of `asyncrl eval`: score a model on an environment's held-out split."""

from __future__ import annotations

from pydantic import Field

from asyncrl.config.base import StrictModel
from asyncrl.config.env import EnvConfig


class EvalRunConfig(StrictModel):
    model: str = Field(description="Hugging Face model id or local path.")
    tokenizer: str | None = Field(
        None, description="Tokenizer location (null = `model`; RL broadcasts hold weights only)."
    )
    env: EnvConfig = Field(
        default_factory=lambda: EnvConfig(id="reverse-text"), description="Environment."
    )
    num_examples: int = Field(256, gt=0, description="Held-out examples to score.")
    rollouts_per_example: int = Field(1, gt=0, description="Samples per example.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0 = greedy).")
    max_tokens: int = Field(64, gt=0, description="Max new tokens per completion.")
    batch_size: int = Field(64, gt=0, description="Prompts generated together.")
    seed: int = Field(0, description="Sampling seed.")
    trust_remote_code: bool = Field(False, description="Allow custom model code from the hub.")
