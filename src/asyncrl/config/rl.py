"""Configuration of `asyncrl rl`: the three roles in one file, with shared fields set once.

The shared fields (model, seq_len, max_steps, max_async_level, output_dir) are copied down to
every role that uses them. A role may repeat a shared value, but a role that disagrees with it,
or two roles that disagree with each other, stop start-up with both key paths named.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, model_validator

from asyncrl.config.base import StepLimit, StrictModel
from asyncrl.config.deployment import machine_deployment
from asyncrl.config.gpu_ids import GPUIdsConfig
from asyncrl.config.inference import InferenceConfig
from asyncrl.config.model_rewards import fill_in_run_judge
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.config.ray import RayConfig
from asyncrl.config.report import ReportConfig
from asyncrl.config.restart import (
    CHECKPOINTS_KEPT,
    ORCHESTRATOR_CHECKPOINT_INTERVAL,
    TRAINER_CHECKPOINT_INTERVAL,
    RestartConfig,
)
from asyncrl.config.seed_names import apply_seed_names
from asyncrl.config.trainer import TrainerConfig
from asyncrl.config.training import QLORA_KEYS

RUN_DIR_NAME = "run_default"

# orchestrator `ckpt.*` key -> the trainer key that must follow it
CHECKPOINT_KEYS = {
    "interval": "save_steps",
    "resume_step": "resume_step",
    "keep_last": "keep_last",
    "keep_interval": "keep_interval",
}

# shared field -> where each role keeps it (a key path inside the `rl` config)
SHARED_FIELDS: dict[str, list[tuple[str, ...]]] = {
    "model": [("inference", "model"), ("orchestrator", "model", "name"), ("trainer", "model")],
    "seq_len": [("orchestrator", "seq_len"), ("trainer", "sequence_len")],
    "max_steps": [("orchestrator", "max_steps"), ("trainer", "max_steps")],
    "max_async_level": [("orchestrator", "max_async_level"), ("trainer", "max_async_level")],
}


def _as_int(value: Any) -> Any:
    try:
        return int(value)
    except (TypeError, ValueError):
        return value  # left for pydantic to report with its path


def _as_max_steps(value: Any) -> Any:
    """null and the seeds' -1 both mean "no limit": compare them as one."""
    value = _as_int(value)
    return None if value in (None, -1) else value


NORMALISE: dict[str, Callable[[Any], Any]] = {
    "model": str,
    "seq_len": _as_int,
    "max_steps": _as_max_steps,
    "max_async_level": _as_int,
}


def _get(data: dict[str, Any], path: tuple[str, ...]) -> tuple[bool, Any]:
    node: Any = data
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _set(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            return  # a wrong type here is reported by pydantic with its path
    node[path[-1]] = value


def propagate_shared(data: dict[str, Any]) -> dict[str, Any]:
    """Copy shared fields into the roles' raw dicts; raise ValueError on any disagreement."""
    data = {key: dict(value) if isinstance(value, dict) else value for key, value in data.items()}
    for role in ("inference", "orchestrator", "trainer"):
        data.setdefault(role, {})
        data[role] = apply_seed_names(role, data[role])  # the wiring below reads asyncrl's names
    if data.get("deployment", "auto") == "auto":
        data["deployment"] = machine_deployment(str(data.get("launcher", "local")))[0]
    async_level_set = data.get("max_async_level") is not None or any(
        _get(data, path)[0] for path in SHARED_FIELDS["max_async_level"]
    )
    if data.get("deployment") == "colocated" and not async_level_set:
        data["max_async_level"] = 0  # on one device nothing overlaps: on-policy by default
    for shared, paths in SHARED_FIELDS.items():
        normalise = NORMALISE[shared]
        known: tuple[str, Any] | None = None
        if shared in data and data[shared] is not None:
            known = (shared, normalise(data[shared]))
        for path in paths:
            found, value = _get(data, path)
            if not found:
                continue
            value = normalise(value)
            if known is None:
                known = (".".join(path), value)
            elif value != known[1]:
                raise ValueError(
                    f"`{'.'.join(path)}` ({value!r}) disagrees with `{known[0]}` ({known[1]!r}); "
                    f"set `{shared}` once at the top level"
                )
        if known is None:
            continue
        data[shared] = known[1]
        for path in paths:
            _set(data, path, known[1])
    _propagate_output_dir(data)
    _check_model_len(data)
    _checkpoints_for_restarts(data)
    _connect_roles(data)
    _colocate(data)
    _point_judges_at_the_run_s_judge(data)
    return data


def _point_judges_at_the_run_s_judge(data: dict[str, Any]) -> None:
    """With a `judge` section, the run starts a judge server: on loopback, on the port after
    the inference server's unless set, behind the run's API key (the inference server's
    variable), loading no weights; judge terms without a `base_url` are pointed at it."""
    judge, inference = data.get("judge"), data["inference"]
    if not isinstance(judge, dict) or not isinstance(inference, dict):
        return
    judge = data["judge"] = dict(judge)
    port = _as_int(inference.get("port", 8000))
    if isinstance(port, int) and "port" not in judge:
        judge["port"] = port + 1
    judge.setdefault("api_key_var", inference.get("api_key_var", "VLLM_API_KEY"))
    judge.setdefault("weight_roots", [])
    host = judge.get("host", "127.0.0.1")
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    model = judge.get("served_model_name") or judge.get("model")
    if isinstance(data["orchestrator"], dict) and model is not None:
        url = f"http://{host}:{judge.get('port', 8000)}/v1"
        data["orchestrator"] = fill_in_run_judge(
            data["orchestrator"], url, str(model), str(judge["api_key_var"])
        )


def _checkpoints_for_restarts(data: dict[str, Any]) -> None:
    """With restarts on and no checkpoint interval set, a restarted role needs something to
    resume from: the orchestrator checkpoints every step (a few kilobytes), the trainer every
    25 steps, each keeping the last two."""
    restart, orchestrator, trainer = data.get("restart"), data["orchestrator"], data["trainer"]
    max_restarts = restart.get("max_restarts", 3) if isinstance(restart, dict) else 3
    if max_restarts == 0:
        return
    if not isinstance(orchestrator, dict) or not isinstance(trainer, dict):
        return
    transports = (orchestrator.get("rollout_transport"), trainer.get("rollout_transport"))
    if any(isinstance(t, dict) and t.get("type") == "zmq" for t in transports):
        return  # neither orchestrator nor trainer can be restarted: they need no checkpoint
    ckpt = orchestrator.setdefault("ckpt", {})
    if not isinstance(ckpt, dict) or ckpt.get("interval") is not None:
        return
    if trainer.get("save_steps") is not None:
        return
    ckpt["interval"] = ORCHESTRATOR_CHECKPOINT_INTERVAL
    trainer["save_steps"] = TRAINER_CHECKPOINT_INTERVAL
    for section in (ckpt, trainer):
        section.setdefault("keep_last", CHECKPOINTS_KEPT)


def _colocate(data: dict[str, Any]) -> None:
    """`deployment: colocated`: the trainer hosts the inference server the config describes."""
    trainer = data["trainer"]
    if data.get("deployment") != "colocated" or not isinstance(trainer, dict):
        return
    if trainer.get("colocated_inference") not in (None, data["inference"]):
        raise ValueError(
            "`trainer.colocated_inference` is set from `inference` for `deployment: colocated`; "
            "configure the server under `inference`"
        )
    trainer["colocated_inference"] = data["inference"]
    if any(trainer.get(key) for key in QLORA_KEYS):  # the engine takes the trainer's weights,
        trainer.setdefault("qlora_served_base", "dequantized")  # and it has no other base


def _connect_roles(data: dict[str, Any]) -> None:
    """Point the roles at each other unless the user did: the orchestrator at the inference
    server, the server's weight roots at the run, one rollout transport and weight broadcast."""
    inference, orchestrator, trainer = data["inference"], data["orchestrator"], data["trainer"]
    if not isinstance(inference, dict) or not isinstance(orchestrator, dict):
        return
    host = inference.get("host", "127.0.0.1")
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    client = orchestrator.setdefault("client", {})
    if isinstance(client, dict) and "base_url" not in client:
        client["base_url"] = [f"http://{host}:{inference.get('port', 8000)}/v1"]
    inference.setdefault("weight_roots", [data["output_dir"]])
    if isinstance(trainer, dict):
        ckpt = orchestrator.get("ckpt") or {}
        if isinstance(ckpt, dict):  # both roles checkpoint at the same steps and resume together
            for ckpt_key, trainer_key in CHECKPOINT_KEYS.items():
                if ckpt_key in ckpt and trainer_key not in trainer:
                    trainer[trainer_key] = ckpt[ckpt_key]
        transport = orchestrator.get("rollout_transport")
        if transport is not None and "rollout_transport" not in trainer:
            trainer["rollout_transport"] = transport
        served = trainer.get("qlora_served_base") == "dequantized"
        if served and data.get("deployment") != "colocated":  # colocated: synced in memory
            orchestrator.setdefault("load_trainer_base", True)
        broadcast = trainer.get("weight_broadcast") or {}
        if isinstance(broadcast, dict) and broadcast.get("type") == "nccl":
            inference.setdefault("weight_broadcast_type", "nccl")
            for key in ("host", "port", "timeout"):
                if key in broadcast:
                    inference.setdefault(f"weight_broadcast_{key}", broadcast[key])


def _propagate_output_dir(data: dict[str, Any]) -> None:
    """Trainer output_dir is the parent; the orchestrator's run dir is a `run_*` child of it."""
    found_trainer, trainer_dir = _get(data, ("trainer", "output_dir"))
    top = data.get("output_dir")
    if top is not None and found_trainer and os.path.normpath(trainer_dir) != os.path.normpath(top):
        raise ValueError(
            f"`trainer.output_dir` ({trainer_dir!r}) disagrees with `output_dir` ({top!r})"
        )
    parent = top if top is not None else (trainer_dir if found_trainer else "outputs")
    data["output_dir"] = parent
    _set(data, ("trainer", "output_dir"), parent)
    found_orch, run_dir = _get(data, ("orchestrator", "output_dir"))
    if not found_orch:
        _set(data, ("orchestrator", "output_dir"), os.path.join(parent, RUN_DIR_NAME))
        return
    run_dir = os.path.normpath(str(run_dir))
    if os.path.dirname(run_dir) != os.path.normpath(parent) or not os.path.basename(
        run_dir
    ).startswith("run_"):
        raise ValueError(
            f"`orchestrator.output_dir` ({run_dir!r}) must be a `run_*` directory directly "
            f"under `output_dir` ({parent!r}), where the trainer looks for it"
        )


def _check_model_len(data: dict[str, Any]) -> None:
    """Inference must hold a whole packed sample: max_model_len >= seq_len (set it if absent)."""
    seq_len = data.get("seq_len")
    if seq_len is None or not isinstance(seq_len, int):
        return
    found, max_len = _get(data, ("inference", "max_model_len"))
    if not found or max_len is None:
        _set(data, ("inference", "max_model_len"), seq_len)
    elif isinstance(_as_int(max_len), int) and _as_int(max_len) < seq_len:
        raise ValueError(
            f"`inference.max_model_len` ({max_len}) is shorter than `seq_len` ({seq_len})"
        )


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
    ray: RayConfig = Field(default_factory=RayConfig, description="(launcher: ray) The cluster.")
    gpu_ids: GPUIdsConfig = Field(
        default_factory=GPUIdsConfig,
        description="(launcher: local) The GPUs each role sees, one CUDA_VISIBLE_DEVICES per "
        "role; unset: colocated gives the trainer all, disaggregated gives the trainer the last "
        "`trainer.world_size` and the server the rest (docs/deployment.md).",
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
    judge: InferenceConfig | None = Field(
        None,
        description="A judge server the run starts beside the others (`asyncrl infer` with its "
        "own log and restarts; null = none): judge terms in `env[].model_rewards` without a "
        "`base_url` use it (docs/judges.md). Launcher `local` only.",
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
