"""Each role's config on a cluster points at where the other roles really run."""

from __future__ import annotations

from typing import Any

from asyncrl.config.rl import RLConfig
from asyncrl.launch.cluster_configs import (
    Endpoints,
    inference_sections,
    orchestrator_section,
    rank_environment,
    trainer_section,
)

ENDPOINTS = Endpoints(
    servers=[("10.0.0.1", 8001), ("10.0.0.2", 8002), ("fd00::3", 8003)],
    orchestrator_host="10.0.0.4",
    rollout_port=5601,
    trainer_host="10.0.0.5",
    master_port=29600,
    broadcast_port=29700,
)


def rl_config(**sections: Any) -> RLConfig:
    data = {"model": "m", "launcher": "ray", "ray": {"inference": {"replicas": 3}},
            "inference": {}, "orchestrator": {}, "trainer": {}}  # fmt: skip
    for name, values in sections.items():
        data[name] = values
    return RLConfig.model_validate(data)


def test_the_orchestrator_gets_every_server_url() -> None:
    orchestrator = orchestrator_section(rl_config(), ENDPOINTS)
    assert orchestrator.client.base_url == [
        "http://10.0.0.1:8001/v1", "http://10.0.0.2:8002/v1", "http://[fd00::3]:8003/v1"
    ]  # fmt: skip
    servers = inference_sections(rl_config(), ENDPOINTS)
    assert [(s.host, s.port) for s in servers] == ENDPOINTS.servers


def test_zmq_batches_go_to_the_orchestrators_node() -> None:
    config = rl_config(orchestrator={"rollout_transport": {"type": "zmq"}})
    orchestrator = orchestrator_section(config, ENDPOINTS)
    trainer = trainer_section(config, ENDPOINTS)
    for transport in (orchestrator.rollout_transport, trainer.rollout_transport):
        assert (transport.type, transport.host, transport.port) == ("zmq", "10.0.0.4", 5601)


def test_nccl_broadcast_gives_each_server_its_rank_in_the_weight_group() -> None:
    config = rl_config(trainer={"lora": False, "weight_broadcast": {"type": "nccl"}})
    trainer = trainer_section(config, ENDPOINTS)
    assert (trainer.weight_broadcast.host, trainer.weight_broadcast.port) == ("10.0.0.5", 29700)
    assert trainer.weight_broadcast.inference_world_size == 3
    servers = inference_sections(config, ENDPOINTS)
    assert [s.weight_broadcast_rank for s in servers] == [1, 2, 3]
    assert {s.weight_broadcast_world_size for s in servers} == {4}
    assert {(s.weight_broadcast_host, s.weight_broadcast_port) for s in servers} == {
        ("10.0.0.5", 29700)
    }


def test_each_rank_gets_what_torchrun_would_set() -> None:
    env = rank_environment(2, 4, ENDPOINTS)
    assert env == {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                   "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29600"}  # fmt: skip
