"""Which transport a config names: `filesystem`, `nccl`, or a user's by import path
(`package.module:TRANSPORT`, a `WeightTransport`), loaded only because the config names it. A
colocated trainer's route is its own: the engine lives in its process.
"""

from __future__ import annotations

from pathlib import Path

from asyncrl.config.base import ConfigError
from asyncrl.config.import_path import load_object
from asyncrl.config.inference import InferenceConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.transport.weights.colocated import ColocatedRoute, HostEngine
from asyncrl.transport.weights.route import WeightIntake, WeightRoute, WeightTarget, WeightTransport

BUILT_IN = {
    "filesystem": "asyncrl.transport.weights.files:TRANSPORT",
    "nccl": "asyncrl.transport.weights.nccl:TRANSPORT",
}


def transport_named(name: str, key: str = "weight_broadcast.type") -> WeightTransport:
    """The transport `name` (a built-in's name or an import path); `key` names the setting in
    the error when it is neither."""
    transport = load_object(BUILT_IN.get(name, name))
    if not isinstance(transport, WeightTransport):
        raise ConfigError(
            f"`{key}: {name}` is not a weight transport: a built-in ({', '.join(BUILT_IN)}) or "
            "the import path of a `WeightTransport` (see asyncrl/transport/weights/)"
        )
    return transport


def open_route(
    config: TrainerConfig, run_dir: Path, host_engine: HostEngine | None = None
) -> WeightRoute:
    """The trainer's end of its transport; `host_engine` builds a colocated trainer's engine."""
    if config.colocated_inference is not None:
        if host_engine is None:
            raise ValueError("trainer.colocated_inference is set but no engine host was given")
        return ColocatedRoute(config, run_dir, host_engine)
    transport = transport_named(config.weight_broadcast.type, "trainer.weight_broadcast.type")
    return transport.route(config, run_dir)


def open_intake(target: WeightTarget, config: InferenceConfig) -> WeightIntake | None:
    """A server's end of its transport, not started; None when weights arrive as files the
    orchestrator asks it to load."""
    transport = transport_named(config.weight_broadcast_type, "inference.weight_broadcast_type")
    return None if transport.intake is None else transport.intake(target, config)
