"""Configuration of the trainer role (`asyncrl train`): the SFT fields plus GRPO's."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from asyncrl.config.base import StrictModel, planned
from asyncrl.config.training import TrainingConfig
from asyncrl.config.transport import RolloutTransportConfig, WeightBroadcastConfig


class LossConfig(StrictModel):
    """The GRPO loss family; the formulas are in the README's loss section."""

    type: Literal["masked_is", "grpo_clip", "dr_grpo", "dapo", "gspo", "cispo"] = Field(
        "masked_is", description="Loss: masked importance sampling (default) or a clipped variant."
    )
    ratio_type: Literal["token", "sequence"] = Field(
        "token", description="Importance ratio per token or per sequence."
    )
    kl_tau: float = Field(0.0, ge=0, description="KL penalty coefficient (masked_is).")
    adv_tau: float = Field(1.0, ge=0, description="Advantage scaling factor (masked_is).")
    teacher_tau: float = Field(
        0.0, ge=0, description="Teacher KL distillation coefficient (needs teacher logprobs)."
    )
    token_mask_low: float = Field(0.125, ge=0, description="Mask tokens with ratio below this.")
    token_mask_high: float = Field(8.0, gt=0, description="Mask tokens with ratio above this.")
    geo_mask_low: float = Field(
        0.1, ge=0, description="Mask a sequence whose geometric-mean ratio is below this."
    )
    geo_mask_high: float = Field(
        10.0, gt=0, description="Mask a sequence whose geometric-mean ratio is above this."
    )
    sequence_mask_low: float = Field(
        0.0, ge=0, description="Mask a sequence whose min token ratio is below this."
    )
    sequence_mask_high: float = Field(
        100.0, gt=0, description="Mask a sequence whose max token ratio is above this."
    )
    sequence_clip_high: float = Field(
        10.0, gt=0, description="Clip the sequence-level importance ratio."
    )
    epsilon: float = Field(0.2, gt=0, description="PPO clip range (grpo_clip, dapo, gspo).")
    epsilon_high: float | None = Field(
        None, gt=0, description="Upper clip range for clip-higher (null = epsilon)."
    )
    beta: float = Field(0.0, ge=0, description="KL-to-reference coefficient (grpo_clip).")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="Estimator of KL to the reference model."
    )


class TrainerConfig(TrainingConfig):
    """Receives batches, computes the GRPO loss, steps the optimizer, broadcasts weights."""

    gradient_accumulation_steps: int = planned(
        1,
        "Optimizer steps are per batch: every micro-batch of a step's batch accumulates into one "
        "update. Splitting a batch into several updates (mini-batches) is not built yet.",
        feature="several optimizer steps per batch",
        gt=0,
    )
    datasets: list[Any] = Field(
        default_factory=list, description="Unused by GRPO: data comes from the orchestrator."
    )
    loss: LossConfig = Field(default_factory=LossConfig, description="GRPO loss.")
    num_iterations: int = Field(1, ge=1, description="Optimizer updates per batch.")
    resume_step: int | None = Field(
        None, ge=-1, description="Checkpoint step to resume from (-1 = latest complete)."
    )
    keep_last: int | None = Field(None, gt=0, description="Keep at most N recent checkpoints.")
    keep_interval: int | None = Field(
        None, gt=0, description="Keep checkpoints at every N steps permanently."
    )
    sync_ref_model: bool = Field(
        False, description="Move the reference model toward the policy during training."
    )
    ref_model_sync_steps: int = Field(512, gt=0, description="Steps between reference model syncs.")
    ref_model_mixup_alpha: float = Field(
        0.6, ge=0, le=1, description="Weight of the policy when syncing the reference model."
    )
    transport_type: Literal["filesystem", "zmq"] | None = Field(
        None, description="How batches arrive (the seeds' name for `rollout_transport.type`)."
    )
    rollout_transport: RolloutTransportConfig = Field(
        default_factory=RolloutTransportConfig,
        description="How batches arrive from the orchestrator (must match its setting).",
    )
    max_async_level: int = Field(
        1, ge=0, description="How many weight broadcasts may be in flight."
    )
    weight_broadcast: WeightBroadcastConfig = Field(
        default_factory=WeightBroadcastConfig, description="How new weights reach inference."
    )

    @model_validator(mode="after")
    def _transport_alias(self) -> TrainerConfig:
        if self.transport_type is None:
            return self
        explicit = "type" in self.rollout_transport.model_fields_set
        if explicit and self.rollout_transport.type != self.transport_type:
            raise ValueError(
                f"`transport_type` ({self.transport_type}) disagrees with "
                f"`rollout_transport.type` ({self.rollout_transport.type})"
            )
        self.rollout_transport.type = self.transport_type
        return self

    @field_validator("datasets")
    @classmethod
    def _no_datasets(cls, datasets: list[Any]) -> list[Any]:
        if datasets:
            raise ValueError("GRPO data comes from the orchestrator; leave `datasets` empty")
        return datasets
