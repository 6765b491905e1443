"""Advantages on hand-worked groups."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.orchestrator import AdvantageConfig
from asyncrl.orchestrator.advantage import group_advantages, process_advantages


def test_mean_baseline() -> None:
    # rewards 1, 0, 0.5, 0.5: mean 0.5
    got = group_advantages([1.0, 0.0, 0.5, 0.5], [3, 3, 3, 3], AdvantageConfig())
    assert got == [0.5, -0.5, 0.0, 0.0]


def test_std_scaling() -> None:
    # rewards 1, 0: mean 0.5, population std 0.5 -> ±1 (up to the epsilon)
    got = group_advantages([1.0, 0.0], [2, 2], AdvantageConfig(scale_by_std=True))
    assert got == pytest.approx([1.0, -1.0], abs=1e-5)


def test_equal_rewards_give_zero_advantage_even_with_std_scaling() -> None:
    assert group_advantages([0.7] * 4, [1] * 4, AdvantageConfig(scale_by_std=True)) == [0.0] * 4


def test_length_weighted_baseline() -> None:
    # baseline = (1*1 + 0*3) / (1 + 3) = 0.25
    got = group_advantages([1.0, 0.0], [1, 3], AdvantageConfig(length_weighted_mean=True))
    assert got == [0.75, -0.25]


def test_custom_function_by_import_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_advantages.py").write_text(
        textwrap.dedent(
            """
            def rank(rewards, lengths, scale=1.0):
                order = sorted(range(len(rewards)), key=lambda i: rewards[i])
                return [scale * order.index(i) for i in range(len(rewards))]
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = AdvantageConfig(type="custom", import_path="my_advantages:rank", kwargs={"scale": 2})
    assert group_advantages([0.3, 0.9, 0.1], [1, 1, 1], config) == [2.0, 4.0, 0.0]
    sys.modules.pop("my_advantages", None)


def test_custom_function_errors_are_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bad_advantages.py").write_text("def short(rewards, lengths):\n    return [1.0]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="returned 1 values for 2 completions"):
        group_advantages(
            [0.0, 1.0], [1, 1], AdvantageConfig(type="custom", import_path="bad_advantages:short")
        )
    with pytest.raises(ConfigError, match="cannot import `nowhere:thing`"):
        group_advantages([0.0], [1], AdvantageConfig(type="custom", import_path="nowhere:thing"))


def test_process_supervision_hand_worked() -> None:
    # completion 0: 4 tokens, steps ending at tokens 1 and 3 with rewards 1 and 0
    # completion 1: 2 tokens, one step ending at token 1 with reward 0.5
    # all step rewards: 1, 0, 0.5 -> mean 0.5, population std sqrt(1/6)
    sigma = (1 / 6) ** 0.5
    high, low, middle = 0.5 / sigma, -0.5 / sigma, 0.0
    got = process_advantages([[(1, 1.0), (3, 0.0)], [(1, 0.5)]], [4, 2])
    assert got[0] == pytest.approx([high + low, high + low, low, low], abs=1e-5)
    assert got[1] == pytest.approx([middle, middle], abs=1e-5)
