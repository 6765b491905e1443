"""Step spans: each named part of a step, the step's wall time, and what no span covers."""

from __future__ import annotations

import time

import pytest

from asyncrl.monitor.spans import StepSpans


def test_spans_add_up_to_the_step_with_the_rest_as_other() -> None:
    spans = StepSpans()
    with spans.span("train"):
        time.sleep(0.05)
    spans.add("generate", 0.02)
    time.sleep(0.03)
    record = spans.take("trainer")
    assert record["trainer/time/train"] == pytest.approx(0.05, abs=0.04)
    assert record["trainer/time/generate"] == 0.02
    step = record["trainer/time/step"]
    assert step >= 0.08
    assert record["trainer/time/other"] == pytest.approx(step - 0.02 - record["trainer/time/train"])
    assert spans.take("trainer")["trainer/time/step"] < step  # the next step starts afresh


def test_moving_part_of_a_wait_relabels_it_and_is_capped_at_the_wait() -> None:
    spans = StepSpans()
    spans.add("wait_batch", 0.5)
    spans.move("wait_batch", "generate", 0.3)
    spans.move("wait_batch", "generate", 9.0)  # more than is left: only what is left moves
    record = spans.take("trainer")
    assert record["trainer/time/wait_batch"] == 0.0
    assert record["trainer/time/generate"] == pytest.approx(0.5)


def test_spans_over_several_steps_are_reported_per_step() -> None:
    spans = StepSpans()
    spans.add("train", 3.0)
    record = spans.take("trainer", steps=3)
    assert record["trainer/time/train"] == pytest.approx(1.0)
