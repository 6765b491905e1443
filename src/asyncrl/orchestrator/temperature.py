"""Sampling temperature per step: fixed, or scheduled from a start to an end temperature."""

from __future__ import annotations

import math

from asyncrl.config.orchestrator import SamplingConfig


def temperature_at(step: int, max_steps: int | None, sampling: SamplingConfig) -> float:
    """Temperature for training step `step` (1-based) of `max_steps`.

    linear: start + (end − start)·p; cosine: end + (start − end)·(1 + cos πp)/2; with
    p = (step − 1) / (max_steps − 1), so step 1 is at the start and the last step at the end.
    """
    schedule = sampling.temp_scheduler
    if schedule is None:
        return sampling.temperature
    if not max_steps:
        raise ValueError("`sampling.temp_scheduler` needs `max_steps`")
    progress = 1.0 if max_steps == 1 else min(1.0, (step - 1) / (max_steps - 1))
    start, end = schedule.start_temperature, schedule.end_temperature
    if schedule.type == "linear":
        return start + (end - start) * progress
    return end + (start - end) * (1 + math.cos(math.pi * progress)) / 2
