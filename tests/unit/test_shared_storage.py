"""A cluster run stops when its roles do not share a run directory it needs, and says why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncrl.config.rl import RLConfig
from asyncrl.launch.roles import RoleFailed
from asyncrl.launch.shared_storage import judge_shared_storage, shared_storage_needs


def rl_config(**sections: Any) -> RLConfig:
    data = {"model": "m", "launcher": "ray", "inference": {}, "orchestrator": {}, "trainer": {}}
    return RLConfig.model_validate({**data, **sections})


NETWORKED = {"orchestrator": {"rollout_transport": {"type": "zmq"}},
             "trainer": {"lora": False, "weight_broadcast": {"type": "nccl"}}}  # fmt: skip


def test_shared_storage_is_needed_unless_batches_and_weights_go_over_the_network() -> None:
    # filesystem batches and weights, and the checkpoints a restarted role resumes from
    assert len(shared_storage_needs(rl_config())) == 3
    networked = rl_config(**NETWORKED)
    assert shared_storage_needs(networked) == []
    with_checkpoints = rl_config(
        orchestrator={"rollout_transport": {"type": "zmq"}, "ckpt": {"interval": 5}},
        trainer={"lora": False, "weight_broadcast": {"type": "nccl"}},
    )
    assert shared_storage_needs(with_checkpoints) == ["checkpoints (`ckpt.interval`)"]


def test_a_directory_not_shared_stops_a_run_that_needs_it() -> None:
    unseen = {"infer-0": [], "orch": ["train-0"], "train-0": ["infer-0", "orch"]}
    with pytest.raises(RoleFailed) as failure:
        judge_shared_storage(rl_config(), Path("/runs/x"), {"infer-0": None}, unseen)
    message = str(failure.value)
    assert "orch does not see what train-0 wrote" in message
    assert "train-0 does not see what infer-0, orch wrote" in message
    assert "`rollout_transport.type: filesystem` (batches)" in message


def test_a_directory_not_shared_is_fine_when_everything_goes_over_the_network() -> None:
    judge_shared_storage(rl_config(**NETWORKED), Path("/runs/x"), {}, {"orch": ["train-0"]})


def test_a_shared_directory_passes() -> None:
    judge_shared_storage(rl_config(), Path("/runs/x"), {"orch": None}, {"orch": []})
