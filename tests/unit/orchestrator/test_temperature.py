from __future__ import annotations

import pytest

from asyncrl.config.orchestrator import SamplingConfig
from asyncrl.orchestrator.temperature import temperature_at


def schedule(kind: str) -> SamplingConfig:
    return SamplingConfig(
        temp_scheduler={"type": kind, "start_temperature": 1.2, "end_temperature": 0.4}
    )


def test_fixed_temperature() -> None:
    assert temperature_at(7, 10, SamplingConfig(temperature=0.7)) == 0.7


def test_linear_hand_worked() -> None:
    # 5 steps: progress 0, 0.25, 0.5, 0.75, 1
    got = [temperature_at(s, 5, schedule("linear")) for s in range(1, 6)]
    assert got == pytest.approx([1.2, 1.0, 0.8, 0.6, 0.4])


def test_cosine_hand_worked() -> None:
    # progress 0.5: halfway (0.8); progress 0.25: 0.4 + 0.8 * (1 + cos(pi/4)) / 2
    assert temperature_at(3, 5, schedule("cosine")) == pytest.approx(0.8)
    assert temperature_at(2, 5, schedule("cosine")) == pytest.approx(0.4 + 0.4 * (1 + 0.5**0.5))
    assert temperature_at(1, 5, schedule("cosine")) == pytest.approx(1.2)
    assert temperature_at(5, 5, schedule("cosine")) == pytest.approx(0.4)


def test_a_schedule_needs_a_step_count_and_excludes_a_fixed_temperature() -> None:
    with pytest.raises(ValueError, match="needs `max_steps`"):
        temperature_at(1, None, schedule("linear"))
    with pytest.raises(ValueError, match="not both"):
        SamplingConfig(
            temperature=0.5,
            temp_scheduler={"type": "linear", "start_temperature": 1, "end_temperature": 0.5},
        )
