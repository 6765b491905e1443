"""The bundles a Ray run asks for, the rank order of its actors, and the message when the cluster
cannot hold them (pure functions: no cluster needed)."""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl.config.rl import RLConfig
from asyncrl.launch.placement import Node, Slot, explain_unplaceable, plan_slots, rank_order


def rl_config(**top: Any) -> RLConfig:
    return RLConfig.model_validate(
        {"model": "m", "inference": {}, "orchestrator": {}, "trainer": {}, **top}
    )


def test_one_bundle_per_replica_then_orchestrator_then_each_rank() -> None:
    config = rl_config(
        launcher="ray",
        ray={"inference": {"replicas": 2, "cpus": 2, "gpus": 1}, "trainer": {"gpus": 1}},
        trainer={"world_size": 3},
    )
    slots = plan_slots(config)
    assert [s.label for s in slots] == ["infer-0", "infer-1", "orch", "train-0", "train-1",
                                        "train-2"]  # fmt: skip
    assert slots[0].resources == {"CPU": 2, "GPU": 1}
    assert slots[2].resources == {"CPU": 1}  # the orchestrator never asks for a GPU
    assert slots[3].resources == {"CPU": 1, "GPU": 1}


def test_several_replicas_need_the_ray_launcher() -> None:
    with pytest.raises(ValueError, match="needs `launcher: ray`"):
        rl_config(ray={"inference": {"replicas": 2}})


def test_ranks_follow_node_address_numerically_then_device() -> None:
    places = [
        ("10.0.0.10", ["1"]),
        ("10.0.0.9", ["3"]),
        ("10.0.0.10", ["0"]),
        ("10.0.0.9", ["2"]),
    ]
    # 10.0.0.9 sorts before 10.0.0.10 (as numbers, not as text), then by device id
    assert rank_order(places) == [3, 1, 2, 0]


def test_same_node_without_devices_keeps_bundle_order() -> None:
    assert rank_order([("192.0.2.2", []), ("192.0.2.2", []), ("192.0.2.1", [])]) == [2, 0, 1]


def test_unplaceable_message_names_the_bundle_and_the_cluster() -> None:
    slots = [Slot("infer", 0, {"CPU": 1}), Slot("orch", 0, {"CPU": 1}),
             Slot("train", 0, {"CPU": 1, "GPU": 8})]  # fmt: skip
    nodes = [
        Node("10.0.0.2", {"CPU": 16, "GPU": 4, "memory": 1e9, "node:10.0.0.2": 1}, {"CPU": 12}),
        Node("10.0.0.1", {"CPU": 8}, {"CPU": 8}),
    ]
    message = explain_unplaceable(slots, nodes, "PACK", 30)
    assert "could not place the run's 3 bundles (PACK) in 30 s" in message
    assert "bundle 2 (train-0: CPU 1, GPU 8) fits no node" in message
    assert "bundle 0" not in message and "bundle 1" not in message
    lines = message.splitlines()
    assert lines[-2].strip() == "10.0.0.1: CPU 8 (free now: CPU 8)"  # sorted by address
    assert lines[-1].strip() == "10.0.0.2: CPU 16, GPU 4 (free now: CPU 12)"


def test_bundles_that_fit_alone_but_not_together_are_said_so() -> None:
    slots = [Slot("infer", 0, {"CPU": 2}), Slot("orch", 0, {"CPU": 2})]
    message = explain_unplaceable(slots, [Node("10.0.0.1", {"CPU": 2}, {"CPU": 2})], "PACK", 5)
    assert "fits no node" not in message
    assert "not all together" in message
