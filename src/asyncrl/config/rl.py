"""Configuration of `asyncrl rl`: the three roles in one file, with shared settings set once.

The shared settings — model, seq_len, max_steps, max_async_level, output_dir, and the sections
`checkpoint`, `rollout_transport` and `weight_broadcast` — have one name each at the top level
and are copied down to every role that uses them (`rl_wiring.py`, `SHARED_FIELDS`: where each
role keeps its copy, under the name it reads when started alone). A role section may repeat a
shared value (a role's own config file loads as it is), but a role that disagrees with it, or
two roles that disagree with each other, stop start-up with both key paths named; `--help` and
the reference list each setting once, at the top.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from asyncrl.config.base import StepLimit, StrictModel
from asyncrl.config.gpu_ids import GPUIdsConfig
from asyncrl.config.inference import InferenceConfig
from asyncrl.config.judge_server import JudgeServerConfig
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.config.ray import RayConfig
from asyncrl.config.report import ReportConfig
from asyncrl.config.restart import (
    RestartConfig,
)
from asyncrl.config.rl_wiring import propagate_shared
from asyncrl.config.run_checkpoint import RunCheckpointConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.config.transport import RolloutTransportConfig, WeightBroadcastConfig


class RLConfig(StrictModel):
    """All three roles of a run, started together by `asyncrl rl`."""

    model: str | None = Field(None, description="Model for every role (copied down).")
    seq_len: int | None = Field(None, gt=0, description="Sequence length for every role.")
    max_steps: StepLimit = Field(None, description="Training steps (null or -1: no limit).")
    max_async_level: int | None = Field(
        None,
        ge=0,
        description="How many steps inference may lag behind the trainer (unset: the roles' "
        "default, 1; 0 with `deployment: colocated`, where nothing overlaps).",
    )
    output_dir: str = Field(
        "outputs", description="Trainer output_dir; the orchestrator uses `<it>/run_default`."
    )
    checkpoint: RunCheckpointConfig = Field(
        default_factory=RunCheckpointConfig,
        description="When both roles checkpoint, what they keep, where they resume.",
    )
    rollout_transport: RolloutTransportConfig = Field(
        default_factory=RolloutTransportConfig,
        description="How batches travel from the orchestrator to the trainer.",
    )
    weight_broadcast: WeightBroadcastConfig = Field(
        default_factory=WeightBroadcastConfig,
        description="How weights travel from the trainer to the servers (the servers receive "
        "by the same transport).",
    )
    launcher: Literal["local", "ray"] = Field(
        "local",
        description="`local`: one child process per role on this machine; `ray`: the roles as "
        "actors on a Ray cluster (see `ray`), with several inference servers if asked.",
    )
    deployment: Literal["auto", "disaggregated", "colocated"] = Field(
        "auto",
        description="`disaggregated`: inference, orchestrator and trainer in processes of their "
        "own, inference generating while the trainer steps; `colocated`: the trainer's process "
        "also serves inference, the two take turns on one device (all of its cores or memory "
        "each) and weights are synced in memory, with no files between them; `auto`: "
        "colocated on a machine with one GPU or one CPU core, disaggregated otherwise (decided "
        "when the config is loaded, and logged).",
    )
    lend_idle_cores: bool = Field(
        True,
        description="(launcher: local, CPU only, disaggregated, one trainer process, the "
        "embedded engine) While the trainer waits for a batch its core runs a second thread of "
        "the engine's, handed back within one engine step of the batch arriving, and once it "
        "has trained its last step, for the rest of the run (`core_lending.py`); false keeps "
        "each role on its own core throughout. A user's own OMP_NUM_THREADS turns the "
        "launcher's core split, and this, off.",
    )
    ray: RayConfig = Field(default_factory=RayConfig, description="(launcher: ray) The cluster.")
    gpu_ids: GPUIdsConfig = Field(
        default_factory=GPUIdsConfig,
        description="(launcher: local) The GPUs each role sees, one CUDA_VISIBLE_DEVICES per "
        "role; unset: colocated gives the trainer all, disaggregated gives the trainer the last "
        "`trainer.world_size` and the server the rest (docs/deployment.md).",
    )
    role_start: Literal["fork", "exec"] = Field(
        "fork",
        description="(launcher: local) How a role process starts: `fork`: from the launcher, "
        "which imports torch and transformers once for every role and restart (each role "
        "saves their 3-5 s of imports; a role vLLM's venv runs is exec'd still, and every "
        "role on a machine with a GPU driver, where the launcher has asked CUDA for its "
        "devices); `exec`: a fresh interpreter per role, `python -m asyncrl.cli <role> <config>`.",
    )
    restart: RestartConfig = Field(
        default_factory=RestartConfig,
        description="Restart a role that dies or hangs, from its last checkpoint (unset "
        "checkpoint intervals then default to every step for the orchestrator, every 25 for "
        "the trainer).",
    )
    report_to: ReportConfig | None = Field(
        None,
        description="Send every role's records, eval results and sample tables to trackers: "
        "`[wandb, tensorboard]` or a section (null = metrics.jsonl only).",
    )
    inference: InferenceConfig = Field(description="Inference server.")
    judge: JudgeServerConfig | None = Field(
        None,
        description="A judge server the run starts beside the others (`asyncrl infer` with its "
        "own log and restarts, serving a frozen model; null = none): judge terms in "
        "`env[].model_rewards` without a `base_url` use it (docs/judges.md). It takes the "
        "`inference` keys that mean something for a frozen model; unset, `port` is the "
        "inference port + 1 and `api_key_var` the inference server's. Launcher `local` only.",
    )
    orchestrator: OrchestratorConfig = Field(description="Orchestrator.")
    trainer: TrainerConfig = Field(description="Trainer.")

    @model_validator(mode="after")
    def _samples_for_trackers(self) -> RLConfig:
        """The orchestrator writes the sample tables the trackers show."""
        report = self.report_to
        if report is not None and report.samples and self.orchestrator.samples_interval is None:
            self.orchestrator.samples_interval = report.interval
        return self

    @model_validator(mode="after")
    def _each_launcher_its_own_keys(self) -> RLConfig:
        if self.launcher == "ray" and self.gpu_ids.any_set():
            raise ValueError(
                "`gpu_ids` places roles for the local launcher; on Ray each role asks for "
                "`ray.inference.gpus` / `ray.trainer.gpus` and Ray picks the devices"
            )
        cuda_terms = self.orchestrator.cuda_reward_models()
        if self.launcher == "ray" and cuda_terms:
            name, device = cuda_terms[0]
            raise ValueError(
                f"env[].model_rewards `{name}` asks for device {device}; on Ray the "
                "orchestrator, whose processes run reward models, is placed with no GPU: use "
                "`device: cpu`, or `launcher: local` (its `gpu_ids.reward_model`)"
            )
        if self.launcher == "local" and self.ray.inference.replicas > 1:
            raise ValueError(
                f"`ray.inference.replicas` ({self.ray.inference.replicas}) needs `launcher: "
                "ray`; the local launcher starts one inference server"
            )
        return self

    @model_validator(mode="after")
    def _served_base_agrees(self) -> RLConfig:
        publishes = (
            self.trainer.qlora_served_base == "dequantized" and self.deployment != "colocated"
        )
        if self.orchestrator.load_trainer_base != publishes:
            raise ValueError(
                f"`orchestrator.load_trainer_base` ({self.orchestrator.load_trainer_base}) "
                "must follow `trainer.qlora_served_base` (dequantized: the trainer publishes "
                "its base for the servers; not in colocated mode); leave it unset"
            )
        return self

    @model_validator(mode="after")
    def _colocated_serves_the_trainer_s_weights(self) -> RLConfig:
        if self.deployment == "colocated" and self.inference.quantization != "none":
            raise ValueError(
                f"`inference.quantization: {self.inference.quantization}` needs an engine of its "
                "own: a colocated engine shares the trainer's weights (use `deployment: "
                "disaggregated`)"
            )
        return self

    @model_validator(mode="after")
    def _colocated_runs_locally(self) -> RLConfig:
        if self.deployment == "colocated" and self.launcher != "local":
            raise ValueError(
                "`deployment: colocated` runs on one machine with `launcher: local` (colocated "
                "roles on Ray are not built)"
            )
        return self

    @model_validator(mode="after")
    def _judge_has_a_place(self) -> RLConfig:
        if self.judge is None:
            return self
        if self.launcher != "local":
            raise ValueError(
                "`judge` (a judge server started by the run) is built for `launcher: local`; on "
                "Ray, start the judge server yourself and give the judge terms its `base_url`"
            )
        if self.judge.port == self.inference.port:
            raise ValueError(
                f"`judge.port` ({self.judge.port}) is the inference server's (`inference.port`); "
                "give the judge a port of its own"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _copy_shared_fields(cls, data: Any) -> Any:
        return propagate_shared(data) if isinstance(data, dict) else data
