"""Configuration of `asyncrl rl --launcher ray`: which cluster, and what each role reserves on it.

The roles' own settings stay in their sections; this holds only what Ray needs to place them:
one placement-group bundle per inference replica, one for the orchestrator and one per trainer
rank (`trainer.world_size` ranks).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from asyncrl.config.base import StrictModel


class InferenceBundle(StrictModel):
    replicas: int = Field(
        1, ge=1, description="Inference servers; the orchestrator spreads rollouts over all."
    )
    cpus: float = Field(1, gt=0, description="CPUs reserved per server.")
    gpus: float = Field(
        0, ge=0, description="GPUs reserved per server (with vLLM/SGLang, `tp` × `dp`)."
    )


class OrchestratorBundle(StrictModel):
    cpus: float = Field(1, gt=0, description="CPUs reserved for the orchestrator (it uses no GPU).")


class TrainerBundle(StrictModel):
    cpus: float = Field(1, gt=0, description="CPUs reserved per trainer rank.")
    gpus: float = Field(0, ge=0, description="GPUs reserved per trainer rank (1 on a GPU cluster).")


class RayConfig(StrictModel):
    """Where the roles run when `launcher: ray`."""

    address: str | None = Field(
        None,
        description="Ray cluster: null = start a local Ray instance for this run, `auto` = "
        "join the cluster this machine belongs to (`ray start`), or `ray://host:10001`.",
    )
    namespace: str = Field("asyncrl", description="Ray namespace of the run's actors.")
    runtime_env: dict[str, Any] = Field(
        default_factory=dict,
        description="Ray runtime_env passed through (`env_vars`, `pip`, `working_dir`, ...).",
    )
    num_cpus: int | None = Field(
        None,
        gt=0,
        description="(local instance) Logical CPUs Ray may hand out; null = this machine's.",
    )
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Placement-group strategy for the run's bundles."
    )
    placement_timeout: float = Field(
        300,
        gt=0,
        description="Seconds to wait for the cluster to place every bundle before giving up.",
    )
    startup_timeout: float = Field(
        600, gt=0, description="Seconds each inference server may take to answer /health."
    )
    inference: InferenceBundle = Field(
        default_factory=InferenceBundle, description="Inference servers."
    )
    orchestrator: OrchestratorBundle = Field(
        default_factory=OrchestratorBundle, description="The orchestrator."
    )
    trainer: TrainerBundle = Field(default_factory=TrainerBundle, description="Each trainer rank.")
