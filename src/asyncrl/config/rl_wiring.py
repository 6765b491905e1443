"""How `asyncrl rl` fills the roles' configs from its own, before anything is validated: the
shared settings copied down to each role under the role's own name (`SHARED_FIELDS`), with any
disagreement refused naming both keys; the run directory; the roles pointed at each other;
checkpoints for restarts; a colocated trainer's server; the run's judge.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from asyncrl.config.deployment import machine_deployment
from asyncrl.config.model_rewards import fill_in_run_judge
from asyncrl.config.restart import (
    CHECKPOINTS_KEPT,
    ORCHESTRATOR_CHECKPOINT_INTERVAL,
    TRAINER_CHECKPOINT_INTERVAL,
)
from asyncrl.config.seed_names import apply_seed_names
from asyncrl.config.training import QLORA_KEYS
from asyncrl.run.layout import DEFAULT_RUN_NAME, RUN_DIR_PREFIX, run_dir, run_name_of


def _both(orchestrator: tuple[str, ...], trainer: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [("orchestrator", *orchestrator), ("trainer", *trainer)]


_ROLLOUT_KEYS = ("type", "host", "port", "hwm")
_BROADCAST_KEYS = ("type", "host", "port", "timeout")

# shared setting (its one name, dotted) -> where each role keeps its copy (a key path inside the
# `rl` config, the role's own name for it)
SHARED_FIELDS: dict[str, list[tuple[str, ...]]] = {
    "model": [("inference", "model"), ("orchestrator", "model", "name"), ("trainer", "model")],
    "seq_len": _both(("seq_len",), ("sequence_len",)),
    "max_steps": _both(("max_steps",), ("max_steps",)),
    "max_async_level": _both(("max_async_level",), ("max_async_level",)),
    "checkpoint.interval": _both(("ckpt", "interval"), ("save_steps",)),
    **{
        f"checkpoint.{key}": _both(("ckpt", key), (key,))
        for key in ("resume_step", "keep_last", "keep_interval")
    },
    **{
        f"rollout_transport.{key}": _both(("rollout_transport", key), ("rollout_transport", key))
        for key in _ROLLOUT_KEYS
    },
    **{
        f"weight_broadcast.{key}": [
            ("trainer", "weight_broadcast", key),
            ("inference", f"weight_broadcast_{key}"),
        ]
        for key in _BROADCAST_KEYS
    },
    **{
        f"weight_broadcast.{key}": [("trainer", "weight_broadcast", key)]
        for key in ("inference_world_size", "delta", "served_dtype")
    },
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
}  # the others are compared as written


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
        normalise = NORMALISE.get(shared, lambda value: value)
        known: tuple[str, Any] | None = None
        top = tuple(shared.split("."))
        found, value = _get(data, top)
        if found and value is not None:
            known = (shared, normalise(value))
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
        _set(data, top, known[1])
        for path in paths:
            _set(data, path, known[1])
    _orchestrator_interval(data)
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
    variable); judge terms without a `base_url` are pointed at it. It loads no weights: that
    is `JudgeServerConfig.inference_config()`, not a key here."""
    judge, inference = data.get("judge"), data["inference"]
    if not isinstance(judge, dict) or not isinstance(inference, dict):
        return
    judge = data["judge"] = dict(judge)
    port = _as_int(inference.get("port", 8000))
    if isinstance(port, int) and "port" not in judge:
        judge["port"] = port + 1
    judge.setdefault("api_key_var", inference.get("api_key_var", "VLLM_API_KEY"))
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
    if not isinstance(ckpt, dict):
        return
    for section, key, interval in (
        (ckpt, "interval", ORCHESTRATOR_CHECKPOINT_INTERVAL),
        (trainer, "save_steps", TRAINER_CHECKPOINT_INTERVAL),
    ):
        if section.get(key) is None:
            section[key] = interval
            section.setdefault("keep_last", CHECKPOINTS_KEPT)


# a top-level setting that one role takes over a shared one (it has no copy of its own to agree)
OVERRIDES = {"checkpoint.orchestrator_interval": ("orchestrator", "ckpt", "interval")}


def _orchestrator_interval(data: dict[str, Any]) -> None:
    """`checkpoint.orchestrator_interval`: the orchestrator's own interval, over the shared one."""
    found, interval = _get(data, ("checkpoint", "orchestrator_interval"))
    if not found or interval is None:
        return
    written = _get(data, OVERRIDES["checkpoint.orchestrator_interval"])[1]
    shared = _get(data, ("checkpoint", "interval"))[1]
    if written is not None and written not in (shared, interval):
        raise ValueError(
            f"`orchestrator.ckpt.interval` ({written!r}) disagrees with "
            f"`checkpoint.orchestrator_interval` ({interval!r}); set the latter only"
        )
    _set(data, OVERRIDES["checkpoint.orchestrator_interval"], interval)


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
    server, the server's weight roots at the run, the orchestrator at the trainer's served base
    (the transports and checkpoints are shared settings: SHARED_FIELDS)."""
    inference, orchestrator, trainer = data["inference"], data["orchestrator"], data["trainer"]
    if not isinstance(inference, dict) or not isinstance(orchestrator, dict):
        return
    host = inference.get("host", "127.0.0.1")
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    client = orchestrator.setdefault("client", {})
    if isinstance(client, dict) and "base_url" not in client:
        client["base_url"] = [f"http://{host}:{inference.get('port', 8000)}/v1"]
    inference.setdefault("weight_roots", [data["output_dir"]])
    if isinstance(trainer, dict) and isinstance(
        broadcast := trainer.get("weight_broadcast", {}), dict
    ):
        # the trainer checksums (and makes deltas) at the precision the servers serve in
        broadcast.setdefault("served_dtype", inference.get("dtype", "auto"))
        trainer["weight_broadcast"] = broadcast
    if isinstance(trainer, dict):
        served = trainer.get("qlora_served_base") == "dequantized"
        if served and data.get("deployment") != "colocated":  # colocated: synced in memory
            orchestrator.setdefault("load_trainer_base", True)


def _propagate_output_dir(data: dict[str, Any]) -> None:
    """Trainer output_dir is the parent; the run directory (the orchestrator's output_dir) is
    `run_<name>` directly under it, and the trainer is told the name (`trainer.run_name`), so
    it finds the run without looking for one."""
    found_trainer, trainer_dir = _get(data, ("trainer", "output_dir"))
    top = data.get("output_dir")
    if top is not None and found_trainer and os.path.normpath(trainer_dir) != os.path.normpath(top):
        raise ValueError(
            f"`trainer.output_dir` ({trainer_dir!r}) disagrees with `output_dir` ({top!r})"
        )
    parent = top if top is not None else (trainer_dir if found_trainer else "outputs")
    data["output_dir"] = parent
    _set(data, ("trainer", "output_dir"), parent)
    found_name, trainer_run_name = _get(data, ("trainer", "run_name"))
    found_orch, orchestrator_dir = _get(data, ("orchestrator", "output_dir"))
    if not found_orch:
        name = str(trainer_run_name) if found_name else DEFAULT_RUN_NAME
        _set(data, ("orchestrator", "output_dir"), str(run_dir(parent, name)))
        _set(data, ("trainer", "run_name"), name)
        return
    orchestrator_dir = os.path.normpath(str(orchestrator_dir))
    name = run_name_of(orchestrator_dir)
    if os.path.dirname(orchestrator_dir) != os.path.normpath(parent) or name is None:
        raise ValueError(
            f"`orchestrator.output_dir` ({orchestrator_dir!r}) must be a "
            f"`{RUN_DIR_PREFIX}*` directory directly under `output_dir` ({parent!r}), where the "
            "trainer looks for it"
        )
    if found_name and str(trainer_run_name) != name:
        raise ValueError(
            f"`trainer.run_name` ({trainer_run_name!r}) disagrees with `orchestrator.output_dir` "
            f"({orchestrator_dir!r}); set `orchestrator.output_dir` only"
        )
    _set(data, ("trainer", "run_name"), name)


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
