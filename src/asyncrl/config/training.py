"""Fields every training command shares (SFT warm-up and the GRPO trainer), as in the seeds,
where the GRPO trainer config inherits all fields of the SFT config."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from asyncrl.config.base import StepLimit, StrictModel, planned, wired

QLORA_KEYS = ("qlora_bnb", "qlora_fp8", "qlora_fp4")
DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class TrainingConfig(StrictModel):
    model: str = wired(..., description="Hugging Face model id or local path.", source="model")
    trust_remote_code: bool = Field(False, description="Allow custom model code from the hub.")
    zero_level: int = planned(
        1, "ZeRO level (1 = shard optimizer state).", feature="multi-GPU training", ge=0, le=3
    )
    output_dir: str = wired(
        "output", description="Where checkpoints and metrics are written.", source="output_dir"
    )
    seed: int = Field(42, description="Random seed.")
    sequence_len: int = wired(
        1024, gt=0, description="Maximum (packed) sequence length.", source="seq_len"
    )
    sample_packing: bool = Field(True, description="Pack samples padding-free.")
    per_device_train_batch_size: int = Field(
        2, gt=0, description="Packed sequences per micro-batch."
    )
    gradient_accumulation_steps: int = Field(
        4, gt=0, description="Micro-batches per optimizer step."
    )
    max_steps: StepLimit = wired(
        None, description="Training steps (null or -1: no limit).", source="max_steps"
    )
    learning_rate: float = Field(
        2e-4,
        ge=0,
        description="Peak learning rate (0 trains nothing: a check that the trainer's logprobs "
        "are the sampler's, step after step).",
    )
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Learning-rate schedule after warmup."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay.")
    optimizer: Literal["adamw", "adamw_8bit"] = Field(
        "adamw",
        description="Optimizer: `adamw` (torch), or `adamw_8bit` (bitsandbytes' 8-bit AdamW; needs "
        "bitsandbytes, refused with the reason where it is missing).",
    )
    recipe: Literal["auto", "fp32", "bf16", "fp8_hybrid", "nvfp4"] = Field(
        "auto",
        description=(
            "Precision: `bf16` (float32 master weights, bfloat16 autocast), `fp32`, or `auto`: "
            "bf16 where the device multiplies bfloat16 natively (probed at start-up), else fp32. "
            "`fp8_hybrid` and `nvfp4` (the seeds' names) are refused: not built."
        ),
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory."
    )
    lora: bool = Field(True, description="Train LoRA adapters instead of all weights.")
    lora_rank: int = Field(16, gt=0, description="LoRA rank.")
    lora_alpha: float = Field(32.0, gt=0, description="LoRA alpha (scale = alpha / rank).")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    lora_target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS),
        min_length=1,
        description="Module names LoRA adapts.",
    )
    qlora_bnb: bool = Field(
        False,
        description="QLoRA: the frozen base in 4-bit NF4 (bitsandbytes, double quantization, "
        "computed in the recipe's precision) under the LoRA adapters, which train in float32. "
        "Any device bitsandbytes runs on (CPU included). Needs `lora: true`.",
    )
    qlora_fp8: bool = Field(
        False,
        description="QLoRA with the frozen base in FP8 (e4m3, 128×128 block scales; "
        "transformers' fine-grained FP8). Needs `lora: true` and a CUDA GPU of compute "
        "capability ≥ 8.9; refused on any other device.",
    )
    qlora_fp4: bool = Field(
        False,
        description="QLoRA with the frozen base in NVFP4 (compute capability ≥ 10.0). Refused "
        "on every device for now: no library installed here trains through an NVFP4 base.",
    )
    logging_steps: int = Field(1, gt=0, description="Log metrics every N steps.")
    save_steps: int | None = wired(
        None, gt=0, description="Save a checkpoint every N steps.", source="checkpoint.interval"
    )
    checkpoint_dir: str | None = Field(
        None,
        description="Checkpoint directory (null = `checkpoints` in the run directory, "
        "`<output_dir>/run_<name>`).",
    )

    @model_validator(mode="after")
    def _qlora_fits(self) -> TrainingConfig:
        chosen = [name for name in QLORA_KEYS if getattr(self, name)]
        if chosen and not self.lora:
            raise ValueError(f"`{chosen[0]}` quantizes the base under LoRA; it needs `lora: true`")
        if len(chosen) > 1:
            raise ValueError(f"{' and '.join(f'`{n}`' for n in chosen)}: choose one base format")
        return self

    @field_validator("recipe")
    @classmethod
    def _recipe_built(cls, recipe: str) -> str:
        if recipe in ("fp8_hybrid", "nvfp4"):
            raise ValueError(f"recipe `{recipe}` is not supported yet (low-precision recipes)")
        return recipe
