"""`deployment: auto`: take turns on one device, generate while training given two."""

from __future__ import annotations

import pytest

from asyncrl.config.deployment import choose_deployment
from asyncrl.config.rl import RLConfig


@pytest.mark.parametrize(
    ("launcher", "gpus", "cores", "expected"),
    [
        ("local", 1, 64, "colocated"),  # one GPU: trainer and engine must share it
        ("local", 4, 64, "disaggregated"),
        ("local", 0, 2, "disaggregated"),  # a core each (this project's CPUs)
        ("local", 0, 1, "colocated"),
        ("ray", 1, 1, "disaggregated"),  # Ray has no colocated roles
    ],
)
def test_auto_takes_turns_only_where_there_is_one_device(
    launcher: str, gpus: int, cores: int, expected: str
) -> None:
    chosen, reason = choose_deployment(launcher, gpus, cores)
    assert chosen == expected
    assert reason


def test_auto_is_the_default_and_an_explicit_layout_is_kept() -> None:
    base = {"model": "m", "inference": {}, "orchestrator": {}, "trainer": {}}
    assert RLConfig(**base).deployment in ("colocated", "disaggregated")
    colocated = RLConfig(**base, deployment="colocated")
    assert colocated.deployment == "colocated"
    assert colocated.trainer.colocated_inference is not None  # wired as before
    assert RLConfig(**base, deployment="disaggregated").trainer.colocated_inference is None
