"""Configuration of the trainer role (`asyncrl train`): the SFT fields plus GRPO's."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from asyncrl.config.base import ConfigError, StrictModel, planned, wired
from asyncrl.config.inference import InferenceConfig
from asyncrl.config.losses import loss_spec, readers_of
from asyncrl.config.seed_names import apply_seed_names
from asyncrl.config.training import TrainingConfig
from asyncrl.config.transport import RolloutTransportConfig, WeightBroadcastConfig
from asyncrl.log import get_logger
from asyncrl.run.layout import DEFAULT_RUN_NAME

logger = get_logger(__name__)

# GSPO's ratio is a per-sequence geometric mean, far closer to 1 than token ratios: the paper
# clips it at 1 - 3e-4 and 1 + 4e-4 (the token losses' 0.2 would almost never clip)
GSPO_EPSILON, GSPO_EPSILON_HIGH = 3e-4, 4e-4
# `trainer.loss` keys of terms the trainer adds to whichever loss is chosen (`trainer/loss.py`)
EVERY_LOSS_READS = frozenset({"entropy_coef", "entropy_target", "cov_clip_fraction"})


class LossConfig(StrictModel):
    """The GRPO loss family. Which loss reads which key, and how it normalises, is the loss
    registry's (`config/losses.py`); the formulas are in `trainer/objectives.py` and
    docs/training.md."""

    type: str = Field(
        "masked_is",
        description="Loss: masked_is (masked importance sampling, the default), grpo_clip, "
        "dr_grpo, dapo, gspo, cispo, or your own by import path `package.module:name` (see "
        "docs/training.md, Writing a loss).",
    )
    ratio_type: Literal["token", "sequence"] = Field(
        "token", description="Importance ratio per token or per sequence."
    )
    kl_tau: float = Field(0.0, ge=0, description="KL penalty coefficient (masked_is).")
    adv_tau: float = Field(1.0, ge=0, description="Advantage scaling factor (masked_is).")
    teacher_tau: float = planned(
        0.0, "Teacher KL distillation coefficient (needs teacher logprobs).",
        feature="teacher logprobs", ge=0,
    )  # fmt: skip
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
    epsilon: float = Field(
        0.2,
        gt=0,
        description="Clip range ε of the ratio: [1-ε, 1+ε_high] (grpo_clip, dapo, dr_grpo, gspo; "
        "cispo uses the upper bound only). GSPO's default is 3e-4, for a sequence-level ratio.",
    )
    epsilon_high: float | None = Field(
        None,
        gt=0,
        description="Upper clip range for clip-higher (null = epsilon; GSPO's default 4e-4).",
    )
    beta: float = Field(
        0.0,
        ge=0,
        description="Coefficient of the KL to a reference model, added to every loss but "
        "masked_is (whose KL term is `kl_tau`, toward the inference policy).",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="Per-token KL estimate added as β·KL, r = π_ref/π: k1 = -log r (its "
        "gradient is zero in expectation: no pull at all), k2 = ½(log r)² (gradient of "
        "KL(π‖π_ref)), k3 = r - 1 - log r (gradient of KL(π_ref‖π)).",
    )
    clip_against: Literal["proximal", "inference"] = Field(
        "proximal",
        description="(grpo_clip, dapo, dr_grpo) What the clipped ratio ρ compares the policy "
        "with. `proximal`: the trainer's own weights at the start of the batch's updates (as "
        "TRL, verl and AReaL's decoupled PPO), so clipping bounds this step's move only; the "
        "sampler having been another policy (a stale version, the engine's numerics) is "
        "corrected by the token weight min(π_prox/π_inf, behaviour_weight_cap). `inference`: "
        "the policy that sampled the tokens, so a batch sampled one version behind is clipped "
        "where the last update moved it most.",
    )
    behaviour_weight_cap: float = Field(
        3.0,
        gt=0,
        description="(clip_against: proximal) Cap of a token's importance weight π_prox/π_inf "
        "(truncated importance sampling; TRL's cap for its vLLM correction is 3).",
    )
    entropy_coef: float = Field(
        0.0,
        ge=0,
        description="Entropy bonus, every loss: the step's loss minus this × the policy's "
        "per-token entropy, weighted as the loss weighs its tokens. It keeps the policy from "
        "collapsing onto one answer per prompt (docs/training.md, When learning stops); above "
        "0, samples of tied groups are computed too (their entropy has a gradient).",
    )
    entropy_target: float | None = Field(
        None,
        gt=0,
        description="With `entropy_coef`: the bonus acts only as the policy's entropy falls "
        "below this (nats per token, at the sampling temperature): its weight is entropy_coef "
        "× max(0, 1 − H/target), H the batch's sampled entropy (the mean −log p of its sampled "
        "tokens, known before the step: nothing to checkpoint). Null: entropy_coef always.",
    )
    cov_clip_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Clip-Cov (Cui et al. 2025), every loss: this share of each micro-batch's "
        "loss tokens, those with the largest covariance (lp − mean lp)·(A − mean A), keep their "
        "value but lose their gradient: the updates that sharpen an already likely token "
        "(entropy's main sink) are left out.",
    )
    dr_grpo_length: Literal["max_tokens", "longest"] = Field(
        "max_tokens",
        description="(dr_grpo) L in the constant normaliser 1/(sequences · L): `max_tokens` = "
        "the generation budget (`sampling.max_tokens`, as the paper and TRL; the longest "
        "completion when unset), `longest` = the longest completion of the step (moves the step "
        "size with the batch).",
    )

    @model_validator(mode="before")
    @classmethod
    def _gspo_clip_range(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") == "gspo":
            data = {"epsilon": GSPO_EPSILON, "epsilon_high": GSPO_EPSILON_HIGH, **data}
        return data

    # a user's loss module is imported when its config is validated (the name must resolve)
    @field_validator("type")
    @classmethod
    def _a_loss_there_is(cls, name: str) -> str:
        spec = loss_spec(name)  # a ConfigError naming what would do
        unknown = sorted(spec.keys_read - set(cls.model_fields))
        if unknown:
            raise ConfigError(
                f"loss `{spec.name}` says it reads {', '.join(f'`{k}`' for k in unknown)}: not "
                f"`trainer.loss` keys (those are {', '.join(cls.model_fields)})"
            )
        return name

    @model_validator(mode="after")
    def _terms_fit_the_loss(self) -> LossConfig:
        if self.beta > 0 and self.type == "masked_is":
            raise ValueError(
                "`beta` (KL to a reference model) applies to every loss but masked_is, which "
                "uses `kl_tau` (KL to the inference policy)"
            )
        reads = loss_spec(self.type).keys_read | {"type"} | EVERY_LOSS_READS
        for key in sorted(self.model_fields_set - reads):
            default = type(self).model_fields[key].get_default(call_default_factory=True)
            if getattr(self, key) != default:
                readers = ", ".join(sorted(readers_of(key))) or "no built-in loss"
                raise ValueError(
                    f"`{key}` does nothing for loss `{self.type}`: it is read by {readers}; "
                    "remove it or choose one of those"
                )
        if self.entropy_target is not None and self.entropy_coef == 0.0:
            raise ValueError(
                "`entropy_target` sets when the entropy bonus acts; its weight is "
                "`entropy_coef`, which is 0: set it too"
            )
        if self.beta > 0 and self.kl_estimator == "k1":
            logger.warning(
                "loss: `kl_estimator: k1` as a loss term has a gradient of zero in expectation, "
                "so `beta` %g pulls nowhere; k3 (the default) or k2 do", self.beta,
            )  # fmt: skip
        return self


class TrainerConfig(TrainingConfig):
    """Receives batches, computes the GRPO loss, steps the optimizer, broadcasts weights."""

    world_size: int = Field(
        1,
        ge=1,
        description=(
            "Trainer ranks: processes started by `asyncrl train` itself (one per GPU; on a "
            "machine without GPUs, CPU processes over gloo). The seeds call it `gpus`."
        ),
    )
    zero_level: int = Field(
        1,
        ge=1,
        le=3,
        description=(
            "Sharding with several ranks (FSDP2): 3 = parameters, gradients and optimizer state "
            "sharded, parameters freed after forward; 2 = the same, parameters kept gathered "
            "from forward to backward; 1 runs as 2 (never more memory than ZeRO-1)."
        ),
    )
    distributed_timeout: float = Field(
        600.0, gt=0, description="Seconds any collective between trainer ranks may take."
    )
    run_dir_timeout: float = Field(
        1800.0,
        gt=0,
        description="Seconds to wait at start for the orchestrator to create the run directory "
        "(`<output_dir>/run_<run_name>`); then the trainer stops, naming the directory.",
    )
    finish_timeout: float = Field(
        3600.0,
        gt=0,
        description="(colocated) Seconds the trainer's engine keeps serving after the last step "
        "for the orchestrator to finish the run (the final weights, the final eval); then the "
        "trainer stops with an error naming what it waited for.",
    )

    gradient_accumulation_steps: int = Field(
        1,
        gt=0,
        description=(
            "Micro-batch passes per optimizer step on each rank, at least: each rank's share of "
            "the batch is spread over this many forward/backward passes (fewer packed rows per "
            "pass), all accumulated into the step's one update, normalised over the whole "
            "step. Several updates per batch: `num_iterations`."
        ),
    )
    loss: LossConfig = Field(default_factory=LossConfig, description="GRPO loss.")
    num_iterations: int = Field(1, ge=1, description="Optimizer updates per batch.")
    shared_prefix: bool = Field(
        False,
        description="Pack the samples of a group as their prompt once, then every completion "
        "(each seeing the prompt and itself): the prompt's activations are computed once per "
        "group instead of once per sample, with the same logprobs and gradients.",
    )
    run_name: str = wired(
        DEFAULT_RUN_NAME,
        pattern=r"^[^/\\]+$",
        description="The run directory is `<output_dir>/run_<run_name>`, the orchestrator's "
        "`output_dir`: batches arrive there, weights and metrics go there (`asyncrl rl` sets it "
        "from `orchestrator.output_dir`).",
        source="orchestrator.output_dir",
    )
    resume_step: int | None = wired(
        None,
        ge=-1,
        description="Checkpoint step to resume from (-1 = latest complete).",
        source="checkpoint.resume_step",
    )
    keep_last: int | None = wired(
        None, gt=0, description="Keep at most N recent checkpoints.", source="checkpoint.keep_last"
    )
    keep_interval: int | None = wired(
        None,
        gt=0,
        description="Keep checkpoints at every N steps permanently.",
        source="checkpoint.keep_interval",
    )
    sync_ref_model: bool = Field(
        False, description="Move the reference model toward the policy during training."
    )
    ref_model_sync_steps: int = Field(512, gt=0, description="Steps between reference model syncs.")
    ref_model_mixup_alpha: float = Field(
        0.6, ge=0, le=1, description="Weight of the policy when syncing the reference model."
    )
    rollout_transport: RolloutTransportConfig = wired(
        default_factory=RolloutTransportConfig,
        description="How batches arrive from the orchestrator (must match its setting).",
        source="rollout_transport",
    )
    max_async_level: int = wired(
        1,
        ge=0,
        description="How many weight broadcasts may be in flight.",
        source="max_async_level",
    )
    weight_broadcast: WeightBroadcastConfig = wired(
        default_factory=WeightBroadcastConfig,
        description="How new weights reach inference.",
        source="weight_broadcast",
    )
    weights_interval: int | None = Field(
        None,
        gt=0,
        description="Keep the weights of every N-th step (no optimizer state) as a broadcast "
        "directory, never pruned: a learning curve for `asyncrl eval --model RUN_DIR` and "
        "snapshots for benchmarks (null: the newest broadcasts only).",
    )
    qlora_served_base: Literal["original", "dequantized"] = Field(
        "original",
        description="(QLoRA) The base inference applies the adapter to. `original`: the "
        "servers' own full-precision base, so their logprobs differ from the trainer's by the "
        "quantization error (`trainer/mismatch_kl` shows it). `dequantized`: the trainer's "
        "quantized base, dequantized and published once at start (`<run_dir>/served_base/`), "
        "which the orchestrator loads into every server before any rollout: no mismatch; the "
        "orchestrator must set `load_trainer_base` (`asyncrl rl` does).",
    )
    colocated_inference: InferenceConfig | None = wired(
        None,
        description="Serve this inference config from the trainer's own process, taking turns "
        "with training on its device, weights synced in memory after every step. Broadcast "
        "directories are then written only at checkpoint steps and the last step, for eval and "
        "export. `asyncrl rl` sets it from `inference` for `deployment: colocated`.",
        source="inference",
    )

    @model_validator(mode="before")
    @classmethod
    def _seed_names(cls, data: Any) -> Any:
        return apply_seed_names("trainer", data)

    @model_validator(mode="after")
    def _lora_fits(self) -> TrainerConfig:
        if self.weight_broadcast.type == "nccl" and self.lora:
            raise ValueError(
                "`weight_broadcast.type: nccl` sends full weights; with LoRA use `filesystem`"
            )
        if self.sync_ref_model and self.lora:
            raise ValueError(
                "`sync_ref_model` with LoRA is not supported (the base is the reference)"
            )
        return self

    @model_validator(mode="after")
    def _quantized_base_fits(self) -> TrainerConfig:
        quantized = self.qlora_bnb or self.qlora_fp8 or self.qlora_fp4
        if self.qlora_served_base == "dequantized" and not quantized:
            raise ValueError(
                "`qlora_served_base: dequantized` serves a quantized base; set `qlora_bnb` "
                "(or another QLoRA key) or leave it at `original`"
            )
        if self.qlora_fp8 and self.world_size > 1:
            raise ValueError(
                "`qlora_fp8` with `world_size` > 1: FSDP2's mixed precision casts floating-point "
                "parameters to the compute dtype, FP8 weights included, which would then reach "
                "their layers without their block scales; `qlora_bnb` (NF4, stored as integers) "
                "runs on several ranks"
            )
        colocated = self.colocated_inference is not None
        if quantized and colocated and self.qlora_served_base != "dequantized":
            raise ValueError(
                "colocated mode with QLoRA: the engine takes its weights from the trainer, "
                "which holds only the quantized base; set `trainer.qlora_served_base: "
                "dequantized`"
            )
        return self

    @model_validator(mode="after")
    def _ranks_and_broadcast(self) -> TrainerConfig:
        if self.world_size > 1 and self.weight_broadcast.type == "nccl":
            raise ValueError(
                "`weight_broadcast.type: nccl` with `world_size` > 1 is not built yet (the "
                "trainer's ranks already use the default process group); use `filesystem`"
            )
        return self

    @model_validator(mode="after")
    def _colocated_fits(self) -> TrainerConfig:
        inference = self.colocated_inference
        if inference is None:
            return self
        if inference.backend == "sglang":
            raise ValueError(
                "`colocated_inference.backend: sglang`: colocated mode runs the embedded engine "
                "or vLLM's, in the trainer's process; SGLang's is not built in"
            )
        if (inference.tp, inference.dp) != (1, 1):
            raise ValueError(
                f"colocated mode shares one device; `inference.tp` {inference.tp} and "
                f"`inference.dp` {inference.dp} must be 1"
            )
        if self.world_size > 1:
            raise ValueError(
                f"colocated mode shares one device; `world_size` is {self.world_size} (the "
                "multi-rank trainer with an engine per rank is not built)"
            )
        if self.weight_broadcast.type != "filesystem":
            raise ValueError(
                "colocated mode syncs weights in memory; leave `weight_broadcast.type` at "
                "`filesystem` (used only for the exports at checkpoint steps)"
            )
        return self
