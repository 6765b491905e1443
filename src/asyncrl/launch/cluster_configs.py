"""Each role's config on a cluster: the `rl` config's sections, pointed at where the other roles
actually run (the addresses and ports the Ray actors reported)."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.config.inference import InferenceConfig
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.config.rl import RLConfig
from asyncrl.config.trainer import TrainerConfig


@dataclass(frozen=True)
class Endpoints:
    servers: list[tuple[str, int]]  # (bind host, port) of each inference replica, in order
    orchestrator_host: str
    rollout_port: int | None  # zmq rollout transport only
    trainer_host: str  # rank 0's node
    master_port: int  # the trainer ranks' torch.distributed rendezvous
    broadcast_port: int | None  # nccl weight broadcast only


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def inference_sections(config: RLConfig, endpoints: Endpoints) -> list[InferenceConfig]:
    sections = []
    replicas = len(endpoints.servers)
    for replica, (host, port) in enumerate(endpoints.servers):
        section = config.inference.model_copy(deep=True)
        section.host, section.port = host, port
        if section.weight_broadcast_type == "nccl":
            assert endpoints.broadcast_port is not None
            section.weight_broadcast_host = endpoints.trainer_host
            section.weight_broadcast_port = endpoints.broadcast_port
            section.weight_broadcast_world_size = replicas + 1
            section.weight_broadcast_rank = replica + 1
        sections.append(section)
    return sections


def orchestrator_section(config: RLConfig, endpoints: Endpoints) -> OrchestratorConfig:
    """Every replica's URL in the client pool: it routes to the least loaded and loads new
    weights into all of them."""
    section = config.orchestrator.model_copy(deep=True)
    section.client.base_url = [f"http://{url_host(h)}:{p}/v1" for h, p in endpoints.servers]
    if section.rollout_transport.type == "zmq":
        assert endpoints.rollout_port is not None
        section.rollout_transport.host = endpoints.orchestrator_host
        section.rollout_transport.port = endpoints.rollout_port
    return section


def trainer_section(config: RLConfig, endpoints: Endpoints) -> TrainerConfig:
    section = config.trainer.model_copy(deep=True)
    if section.rollout_transport.type == "zmq":
        assert endpoints.rollout_port is not None
        section.rollout_transport.host = endpoints.orchestrator_host
        section.rollout_transport.port = endpoints.rollout_port
    if section.weight_broadcast.type == "nccl":
        assert endpoints.broadcast_port is not None
        section.weight_broadcast.host = endpoints.trainer_host
        section.weight_broadcast.port = endpoints.broadcast_port
        section.weight_broadcast.inference_world_size = len(endpoints.servers)
    return section


def rank_environment(rank: int, world_size: int, endpoints: Endpoints) -> dict[str, str]:
    """What torchrun would set for one rank. Ray gives each rank's actor only its own GPUs
    (CUDA_VISIBLE_DEVICES), so its device is always local index 0."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": endpoints.trainer_host,
        "MASTER_PORT": str(endpoints.master_port),
    }
