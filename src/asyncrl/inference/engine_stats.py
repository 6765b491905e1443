"""Engine counters for /metrics: generated tokens, and throughput over a recent window."""

from __future__ import annotations

import time
from collections import deque


class EngineStats:
    """Counters for /metrics: generated tokens, and throughput over a recent window."""

    def __init__(self, window_seconds: float = 10.0) -> None:
        self.generated_tokens = 0
        self.prefill_tokens = 0  # tokens run through prefill (a shared prompt counts once)
        self.busy_seconds = 0.0  # time spent in steps (prefill and decode), summed
        self.borrowed_seconds = 0.0  # of which with a lent core beside the engine's own
        self.steps = 0
        self.window_seconds = window_seconds
        self._recent: deque[tuple[float, int]] = deque()

    def record(self, tokens: int, elapsed: float, borrowed: bool = False) -> None:
        now = time.monotonic()
        self.generated_tokens += tokens
        self.busy_seconds += elapsed
        self.borrowed_seconds += elapsed if borrowed else 0.0
        self.steps += 1
        self._recent.append((now, tokens))
        while self._recent and self._recent[0][0] < now - self.window_seconds:
            self._recent.popleft()

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        recent = [(t, n) for t, n in self._recent if t >= now - self.window_seconds]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1e-3)
        return sum(n for _, n in recent) / span
