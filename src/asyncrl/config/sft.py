"""Configuration of `asyncrl sft`: supervised warm-up on an environment's (prompt, answer) pairs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from asyncrl.config.base import StepLimit, planned
from asyncrl.config.env import EnvConfig, rubric_only
from asyncrl.config.training import QLORA_KEYS, TrainingConfig


class SFTConfig(TrainingConfig):
    """Trains on chat-formatted prompt + answer, loss on the answer tokens only.

    Defaults differ from the GRPO trainer's where warm-up of a small model wants it: full
    fine-tuning, plain AdamW and a cosine schedule.
    """

    gpus: int = planned(1, "Number of GPUs.", feature="multi-GPU SFT", ge=1)
    env: EnvConfig = Field(
        default_factory=lambda: EnvConfig(id="reverse-text"),
        description="Environment whose training split gives (prompt, answer) pairs.",
    )
    num_examples: int = Field(
        20000, gt=0, description="Training examples drawn from the environment's train split."
    )
    output_dir: str = Field("outputs/sft", description="Where checkpoints and metrics go.")
    sequence_len: int = Field(512, gt=0, description="Tokens per packed sequence.")
    per_device_train_batch_size: int = Field(
        4, gt=0, description="Packed sequences per micro-batch."
    )
    gradient_accumulation_steps: int = Field(
        1, gt=0, description="Micro-batches per optimizer step."
    )
    max_steps: StepLimit = Field(
        None, description="Optimizer steps (null or -1: one pass over the examples)."
    )
    learning_rate: float = Field(1e-3, gt=0, description="Peak learning rate.")
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = Field(
        "cosine", description="Learning-rate schedule after warmup."
    )
    warmup_steps: int = Field(20, ge=0, description="Linear warmup steps.")
    optimizer: Literal["adamw", "adamw_8bit"] = Field("adamw", description="Optimizer.")
    lora: bool = Field(False, description="Train LoRA adapters instead of all weights.")
    eval_examples: int = Field(
        256, ge=0, description="Held-out examples scored greedily at the end (0 = none)."
    )
    eval_max_tokens: int = Field(64, gt=0, description="Max new tokens when evaluating.")

    @model_validator(mode="after")
    def _no_quantized_base(self) -> SFTConfig:
        chosen = [name for name in QLORA_KEYS if getattr(self, name)]
        if chosen:
            raise ValueError(
                f"`{chosen[0]}` is built for the GRPO trainer (`asyncrl train` / `rl`): `asyncrl "
                "sft` saves its model with the LoRA update merged into the base, and merging into "
                "a quantized base would quantize the update away"
            )
        return self

    @field_validator("env")
    @classmethod
    def _rubric_only(cls, env: EnvConfig) -> EnvConfig:
        return rubric_only(env, "`asyncrl sft` evaluates with the environment's own rubric")
