"""Dynamic sampling (`buffer.online_difficulty_filtering`): a group is dropped when every
advantage of it is 0, whatever the rewards were, and every group dropped on the way to a batch
is reported with that batch, not only those dropped in the call that completed it."""

from __future__ import annotations

from collections import Counter, deque
from types import SimpleNamespace

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.loading import load_config
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.orchestrator.group import Group
from asyncrl.orchestrator.orchestrator import Orchestrator
from asyncrl.types import TrainingSample


def group_with(advantages: list[list[float]]) -> Group:
    samples = [
        TrainingSample(prompt_ids=[1], completion_ids=[2] * len(a), completion_mask=[True] * len(a),
                       inference_logprobs=[-1.0] * len(a), advantages=a,
                       policy_versions=[0] * len(a), temperature=1.0, env="e")
        for a in advantages
    ]  # fmt: skip
    return Group(drawn=None, env_name="e", samples=samples, rewards=[0.0] * len(samples),  # type: ignore[arg-type]
                 values=[], truncated=[False] * len(samples))  # fmt: skip


def test_a_group_has_no_signal_only_when_every_tokens_advantage_is_0() -> None:
    assert group_with([[0.0, 0.0], [0.0]]).zero_advantage
    assert not group_with([[0.5, 0.5], [-0.5]]).zero_advantage
    # per-step advantages: the first token 0, a later one not (the old check read the first)
    assert not group_with([[0.0, 0.3], [0.0, -0.3]]).zero_advantage


def fresh(trainable: bool) -> SimpleNamespace:
    return SimpleNamespace(stalest_rollout_version=5, oldest_token_version=5, trainable=trainable)


def test_drops_on_the_way_to_a_batch_are_all_reported_with_it() -> None:
    config = SimpleNamespace(max_async_level=1, max_off_policy_steps=2, batch_size=16,
                             rollouts_per_example=8)  # fmt: skip
    orchestrator = SimpleNamespace(config=config, aborted_groups=1, drops=Counter())
    assemble = Orchestrator.assemble
    assert assemble(orchestrator, 6, deque([fresh(False), fresh(True)])) is None  # 1 of 2
    assert assemble(orchestrator, 6, deque([fresh(False)])) is None
    ready = deque([fresh(True), fresh(False), fresh(True)])
    chosen, drops = assemble(orchestrator, 6, ready)  # type: ignore[misc]
    assert len(chosen) == 2
    assert drops == Counter({"no_signal": 3, "aborted": 1})  # every call's, not the last one's
    assert orchestrator.drops == Counter()  # the next batch starts counting afresh


def test_filtering_with_groups_of_one_is_refused() -> None:
    base = ["--model.name", "m", "--env", '[{"id": "reverse-text"}]', "--batch_size", "8",
            "--buffer.online_difficulty_filtering", "true"]  # fmt: skip
    load_config(OrchestratorConfig, [], [*base, "--rollouts_per_example", "2"])
    with pytest.raises(ConfigError, match="every group"):
        load_config(OrchestratorConfig, [], [*base, "--rollouts_per_example", "1"])
