"""Where a step's wall time goes: named spans, logged with the step as `<role>/time/<span>`.

Each role times the parts of its loop (the trainer: waiting for the batch, packing, training,
weights out, checkpointing; the orchestrator: waiting for weights, generating, sending) and
logs them with the step, beside `<role>/time/step`, the wall time since the previous step
ended, and `<role>/time/other`, what no span covers. Summed over a run they say which part
to make faster; the race benchmark builds its per-system decomposition from them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class StepSpans:
    """Seconds per named span since the last `take`, and the step's wall time."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.step_started = time.perf_counter()

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - started

    def add(self, name: str, seconds: float) -> None:
        """A span timed elsewhere (another thread, another process's counter)."""
        self.seconds[name] += seconds

    def move(self, source: str, target: str, seconds: float) -> None:
        """Re-label part of a span: of the time waited for a batch, what the colocated engine
        spent generating it."""
        seconds = min(seconds, self.seconds[source])
        self.seconds[source] -= seconds
        self.seconds[target] += seconds

    def take(self, role: str, steps: int = 1) -> dict[str, float]:
        """`<role>/time/<span>` per step for every span since the last call (over `steps`
        steps), `<role>/time/step` and `<role>/time/other`; then start afresh."""
        now = time.perf_counter()
        steps = max(1, steps)
        step = (now - self.step_started) / steps
        record = {
            f"{role}/time/{name}": value / steps for name, value in sorted(self.seconds.items())
        }
        record[f"{role}/time/step"] = step
        record[f"{role}/time/other"] = max(0.0, step - sum(self.seconds.values()) / steps)
        self.seconds.clear()
        self.step_started = now
        return record
