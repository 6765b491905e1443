"""Configuration of the orchestrator role (`asyncrl orch`): keys follow the seeds' tables."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from asyncrl.config.base import StepLimit, StrictModel, planned, wired
from asyncrl.config.env import EnvConfig
from asyncrl.config.passthrough import checked_passthrough, passthrough_field
from asyncrl.config.seed_names import apply_seed_names
from asyncrl.config.transport import RolloutTransportConfig
from asyncrl.run.layout import run_dir
from asyncrl.run_secret import server_key


class ModelConfig(StrictModel):
    name: str | None = Field(None, description="Hugging Face model id or local path.")


class TempSchedulerConfig(StrictModel):
    type: Literal["linear", "cosine"] = Field(description="Shape of the temperature schedule.")
    start_temperature: float = Field(gt=0, description="Temperature at step 0.")
    end_temperature: float = Field(gt=0, description="Temperature at the final step.")


class SamplingConfig(StrictModel):
    max_tokens: int | None = Field(None, gt=0, description="Max tokens per generation.")
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature (set this or `temp_scheduler`, not both)."
    )
    temp_scheduler: TempSchedulerConfig | None = Field(
        None, description="Temperature schedule over the run's steps."
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")
    top_k: int = Field(-1, ge=-1, description="Top-k sampling (-1 = off).")
    repetition_penalty: float = Field(1.0, gt=0, description="Repetition penalty.")
    min_tokens: int = Field(0, ge=0, description="Minimum tokens per sequence.")
    seed: int | None = Field(None, description="Sampling seed.")

    @model_validator(mode="after")
    def _one_temperature_source(self) -> SamplingConfig:
        if self.temp_scheduler is not None and "temperature" in self.model_fields_set:
            raise ValueError("set `temperature` or `temp_scheduler`, not both")
        return self


class ElasticConfig(StrictModel):
    hostname: str = Field(description="DNS hostname resolving to the inference servers.")
    port: int = Field(8000, ge=1, le=65535, description="Port of the elastic pool servers.")
    sync_interval: float = Field(5.0, gt=0, description="Seconds between DNS re-checks.")


class ClientConfig(StrictModel):
    base_url: list[str] = Field(
        default_factory=lambda: ["http://localhost:8000/v1"],
        min_length=1,
        description="Inference server URL(s).",
    )
    timeout: float = Field(1200, gt=0, description="Request timeout in seconds.")
    startup_timeout: float = Field(
        600,
        gt=0,
        description="Seconds to wait at start-up for each server's `/health` (it may still be "
        "loading its model; a colocated trainer serves only once it has resumed).",
    )
    api_key_var: str = Field("VLLM_API_KEY", description="Environment variable with the API key.")
    skip_model_check: bool = Field(False, description="Skip checking the `/models` endpoint.")
    elastic: ElasticConfig | None = Field(None, description="DNS discovery of an elastic pool.")
    pause_for_updates: Literal["none", "keep", "wait"] = Field(
        "none",
        description="How generation meets a weight update: `none` (requests in flight continue "
        "on the new weights, as PipelineRL does; each token's version is recorded where the "
        "engine reports it), `keep` (frozen during the load, then continued) or `wait` (the "
        "update waits for requests in flight to finish).",
    )

    def api_key(self) -> str | None:
        """The servers' key, never stored in config: `$<api_key_var>` where set, else the one
        the run's secret gives that variable (`run_secret.server_key`), else None."""
        return server_key(self.api_key_var)


class BufferConfig(StrictModel):
    seed: int | None = Field(None, description="Random seed for deterministic sampling.")
    online_difficulty_filtering: bool = Field(
        False,
        description="Drop groups whose advantages are all 0 (rewards all equal: nothing to "
        "learn) and generate others in their place (DAPO's dynamic sampling).",
    )
    easy_threshold: float | None = Field(
        None, description="Reward above which a problem is `easy`."
    )
    hard_threshold: float | None = Field(
        None, description="Reward below which a problem is `hard`."
    )
    easy_fraction: float = Field(
        0.0, ge=0, le=1, description="Fraction of easy problems promoted to normal on start."
    )
    hard_fraction: float = Field(
        0.0, ge=0, le=1, description="Fraction of hard problems promoted to normal on start."
    )
    hash_keys: list[str] = Field(
        default_factory=lambda: ["task", "prompt"],
        min_length=1,
        description="Example fields used for deduplication.",
    )
    weight_duplicates: bool = Field(
        True,
        description="Draw an example as often as copies of it (by `hash_keys`) came from the "
        "environment, so deduplication does not reweight the task: a generator's small items "
        "repeat (reasoning-gym `products` of 1-2 digits: 89 distinct one-digit questions make "
        "half of its items). false: every distinct example equally often.",
    )
    skip_verification: bool = Field(
        False, description="Disable reward scoring (every reward is 0)."
    )
    env_ratios: list[float] | None = Field(
        None, description="Per-environment sampling ratios (must sum to > 0)."
    )

    @model_validator(mode="after")
    def _ratios_positive(self) -> BufferConfig:
        if self.env_ratios is not None and (
            any(r < 0 for r in self.env_ratios) or sum(self.env_ratios) <= 0
        ):
            raise ValueError("`env_ratios` must be non-negative and sum to more than 0")
        return self


class AdvantageConfig(StrictModel):
    type: Literal["default", "custom", "process"] = Field(
        "default",
        description="`default` (group-relative), `custom` (import_path), or `process` (per-step "
        "rewards from the environment's `step_rewards` → per-token advantages).",
    )
    length_weighted_mean: bool = Field(
        False, description="Weight the group baseline by completion length."
    )
    scale_by_std: bool = Field(
        False, description="Divide by the group's reward std (original GRPO; off as in Dr. GRPO)."
    )
    import_path: str | None = Field(
        None, description="(custom) `module:function` computing advantages."
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="(custom) Keyword arguments for the function."
    )

    @model_validator(mode="after")
    def _custom_needs_path(self) -> AdvantageConfig:
        if self.type == "custom" and not self.import_path:
            raise ValueError("`type: custom` needs `import_path`")
        return self


class GibberishFilterConfig(StrictModel):
    type: Literal["gibberish"] = "gibberish"
    enforce: bool = Field(False, description="Mask flagged rollouts from the training loss.")
    token_id_threshold: int = Field(
        100000, ge=0, description="Min token id to flag as a gibberish candidate."
    )
    logprob_offset: float = Field(2.0, description="Offset from the uniform-distribution logprob.")


class RepetitionFilterConfig(StrictModel):
    type: Literal["repetition"] = "repetition"
    enforce: bool = Field(False, description="Mask flagged rollouts from the training loss.")
    window: int = Field(3000, gt=0, description="Consecutive high-probability steps to flag.")
    prob_threshold: float = Field(0.99, gt=0, le=1, description="Per-token probability threshold.")


FilterConfig = Annotated[
    GibberishFilterConfig | RepetitionFilterConfig, Field(discriminator="type")
]


class CheckpointConfig(StrictModel):
    interval: int | None = wired(
        None, gt=0, description="Save a checkpoint every N steps.", source="checkpoint.interval"
    )
    resume_step: int | None = wired(
        None,
        ge=-1,
        description="Step to resume from (-1 = latest complete checkpoint).",
        source="checkpoint.resume_step",
    )
    wait_for_weights_timeout: float = Field(
        3600.0,
        gt=0,
        description="Seconds to wait for the weights a step needs from the trainer (its first "
        "broadcast at start, each later one, the served base); then the orchestrator stops, "
        "naming the version it waited for. Raise it for a trainer whose start or step is slower.",
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
    skip_progress: bool = Field(False, description="Do not restore progress on resume.")
    skip_buffer: bool = Field(False, description="Do not restore the buffer on resume.")


class EvalSamplingConfig(StrictModel):
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")
    max_tokens: int | None = Field(
        None, gt=0, description="Max new tokens per completion (null = training's)."
    )
    seed: int | None = Field(0, description="Seed of example i is seed + i (null = unseeded).")


class EvalConfig(StrictModel):
    """Held-out evaluation while training runs, on the same servers (`orchestrator/online_eval`)."""

    env: list[EnvConfig] = Field(
        default_factory=list,
        description="Eval-only environments, besides the held-out split of every training one.",
    )
    num_examples: int = Field(64, gt=0, description="Held-out examples per environment.")
    rollouts_per_example: int = Field(
        1, ge=1, description="Samples per example (k of mean@k, best@k, pass@k)."
    )
    interval: int = Field(100, gt=0, description="Evaluate every N training steps.")
    eval_base_model: bool = Field(True, description="Also evaluate the starting weights (step 0).")
    skip_eval_on_resume: bool = Field(
        True, description="Skip the eval of the step a run resumes from (it was done before)."
    )
    sampling: EvalSamplingConfig = Field(
        default_factory=EvalSamplingConfig, description="Eval sampling (greedy by default)."
    )
    max_concurrent: int = Field(
        8,
        gt=0,
        description="Eval requests in flight at once, beside the rollout requests; an eval "
        "with no rollout beside it (step 0's, and those at the run's end) sends all at once.",
    )
    pass_threshold: float = Field(
        1.0, description="Reward at which a sample counts as solved, for pass@k."
    )
    cancel_inflight_rollouts_on_eval: bool = planned(
        False, "Cancel in-flight rollouts before evaluating.", feature="eval that stops rollouts"
    )


class OrchestratorConfig(StrictModel):
    """Schedules rollouts, scores them, computes advantages and hands batches to the trainer."""

    model: ModelConfig = wired(
        default_factory=ModelConfig, description="Policy model.", source="model"
    )
    env: list[EnvConfig] = Field(
        default_factory=lambda: [EnvConfig(id="reverse-text")],
        min_length=1,
        description="Training environments.",
    )
    batch_size: int = Field(128, gt=0, description="Rollouts per training step.")
    rollouts_per_example: int = Field(1, gt=0, description="Samples generated per prompt.")
    seq_len: int = wired(
        2048, gt=0, description="Maximum sequence length for packing.", source="seq_len"
    )
    max_steps: StepLimit = wired(
        None, description="Total training steps (null or -1: run indefinitely).", source="max_steps"
    )
    max_async_level: int = wired(
        1,
        ge=0,
        description="How many steps inference may lag behind the trainer.",
        source="max_async_level",
    )
    max_off_policy_steps: int = Field(
        8, ge=0, description="Max policy lag of a rollout before it is discarded."
    )
    oversampling_factor: float = Field(
        1.0, ge=1.0, description="Factor by which to oversample rollout requests."
    )
    output_dir: str = Field(
        str(run_dir("outputs")),
        description="Run directory: `run_<name>` directly in the trainer's output_dir (the "
        "trainer's `run_name` is `<name>`).",
    )
    seed: int = Field(42, description="Random seed.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling.")
    client: ClientConfig = Field(default_factory=ClientConfig, description="Inference client.")
    buffer: BufferConfig = Field(default_factory=BufferConfig, description="Rollout buffer.")
    advantage: AdvantageConfig = Field(
        default_factory=AdvantageConfig, description="Advantage computation."
    )
    filters: list[FilterConfig] = Field(default_factory=list, description="Rollout filters.")
    mask_truncated_completions: bool = Field(
        False, description="Mask completions cut by max_tokens out of the loss (overlong filter)."
    )
    ckpt: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoints.")
    reward_workers: int = Field(2, gt=0, description="Reward worker processes per environment.")
    reward_timeout: float = Field(
        30.0, gt=0, description="Seconds one rollout's reward may take before it scores 0."
    )
    reward_memory_limit: float | None = Field(
        8.0,
        gt=0,
        description="GiB of address space per reward worker and its children (null = no limit).",
    )
    reward_cpu_limit: float | None = Field(
        60.0, gt=0, description="CPU seconds one rollout's reward may use (null = no limit)."
    )
    reward_env_passthrough: list[str] = passthrough_field(
        "reward workers (rubric functions, turns, tools and what they start), scorer plugins and "
        "reward models, and the start-up check of a function named by import path"
    )
    eval: EvalConfig | None = Field(
        None, description="Online evaluation on held-out examples (null = none)."
    )
    samples_interval: int | None = Field(
        None,
        gt=0,
        description="Write the batch's prompts, completions and rewards to "
        "`samples/step_N.jsonl` every N steps (set by `rl` from `report_to.interval`).",
    )
    rollout_transport: RolloutTransportConfig = wired(
        default_factory=RolloutTransportConfig,
        description="How batches reach the trainer.",
        source="rollout_transport",
    )
    load_trainer_base: bool = Field(
        False,
        description="Wait for the base the trainer publishes at start (`<run_dir>/served_base/`, "
        "a QLoRA trainer's dequantized base: `trainer.qlora_served_base: dequantized`) and load "
        "it into every server before any rollout, and again into a server that restarts, so "
        "adapters apply to the base the trainer trains on. Set by `asyncrl rl`.",
    )

    @model_validator(mode="before")
    @classmethod
    def _seed_names(cls, data: Any) -> Any:
        return apply_seed_names("orchestrator", data)

    @model_validator(mode="after")
    def _passthrough_holds_no_key(self) -> OrchestratorConfig:
        checked_passthrough(self.reward_env_passthrough, self.secret_variables())
        return self

    @model_validator(mode="after")
    def _runnable(self) -> OrchestratorConfig:
        if self.model.name is None:
            raise ValueError("`model.name` is required (the model the servers serve)")
        if self.sampling.temp_scheduler is not None and self.max_steps is None:
            raise ValueError("`sampling.temp_scheduler` needs `max_steps`")
        return self

    @model_validator(mode="after")
    def _batch_holds_whole_groups(self) -> OrchestratorConfig:
        if self.batch_size % self.rollouts_per_example:
            raise ValueError(
                f"`batch_size` ({self.batch_size}) must be a multiple of "
                f"`rollouts_per_example` ({self.rollouts_per_example})"
            )
        if self.max_off_policy_steps < self.max_async_level:
            raise ValueError(
                f"`max_off_policy_steps` ({self.max_off_policy_steps}) must be at least "
                f"`max_async_level` ({self.max_async_level}): otherwise every rollout is dropped"
            )
        if self.buffer.online_difficulty_filtering and self.rollouts_per_example == 1:
            raise ValueError(
                "`buffer.online_difficulty_filtering` drops groups whose advantages are all 0, "
                "and with `rollouts_per_example: 1` that is every group: raise it or turn the "
                "filter off"
            )
        return self

    def secret_variables(self) -> list[str]:
        """The variables that hold a key this orchestrator uses: the inference servers', each
        env-server's, each judge's. Its reward and scorer processes inherit none of them."""
        envs = [*self.env, *(self.eval.env if self.eval else [])]
        judges = [term for env in envs for term in env.model_rewards if term.type == "judge"]
        return [
            self.client.api_key_var,
            *(env.api_key_var for env in envs),
            *(term.api_key_var for term in judges if term.api_key_var),
        ]

    def cuda_reward_models(self) -> list[tuple[str, str]]:
        """(name, device) of every reward-model term that asks for a GPU (`device: cuda…`)."""
        envs = [*self.env, *(self.eval.env if self.eval else [])]
        return [
            (term.name, term.device)
            for env in envs
            for term in env.model_rewards
            if term.type == "reward_model" and term.on_cuda()
        ]
