"""What one model term's calls cost, and how they failed, between two training steps.

A call fails in one of four ways, each a counter: `timeout` (no answer in time), `unavailable`
(no server or process to answer: refused connections, 5xx and 429 after the retries, a scorer
process that died), `error` (the endpoint refused the request, or its answer is not an answer:
4xx, a body that is not a completion, a scorer that raised) and `unparseable` (an answer with
no score in it). A failed call costs its rollout (reward 0), never the run.

`take()` gives the step's record under `orchestrator/model_reward/<term>/…` and starts afresh:
the calls made since the previous record, online evaluation's included.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

FAILURE_KINDS = ("timeout", "unavailable", "error", "unparseable")


@dataclass(frozen=True)
class Judged:
    """A term's value for one rollout, or why it has none (`failure`, one of FAILURE_KINDS)."""

    value: float | None
    failure: str | None = None

    @classmethod
    def failed(cls, kind: str) -> Judged:
        assert kind in FAILURE_KINDS, kind
        return cls(None, kind)


@dataclass
class TermFigures:
    """One step's figures of a term."""

    scored: int = 0  # rollouts given a value
    failures: Counter[str] = field(default_factory=Counter)
    requests: int = 0  # HTTP requests or batches sent, retries included
    retries: int = 0
    latency_total: float = 0.0  # seconds, summed over requests
    latency_max: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    batch_items: int = 0  # rollouts in the batches sent (scorer processes)
    busy_seconds: float = 0.0  # wall time with at least one request in flight
    in_flight_max: int = 0  # requests in flight at once, at most

    def absorb(self, other: TermFigures) -> None:
        """Add another term's figures (two environments with a term of the same name)."""
        self.scored += other.scored
        self.failures.update(other.failures)
        self.requests += other.requests
        self.retries += other.retries
        self.latency_total += other.latency_total
        self.latency_max = max(self.latency_max, other.latency_max)
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.batch_items += other.batch_items
        self.busy_seconds += other.busy_seconds
        self.in_flight_max = max(self.in_flight_max, other.in_flight_max)

    def metrics(self, name: str) -> dict[str, float]:
        prefix = f"orchestrator/model_reward/{name}"
        record: dict[str, float] = {
            f"{prefix}/scored": self.scored,
            f"{prefix}/requests": self.requests,
            f"{prefix}/retries": self.retries,
            f"{prefix}/latency_mean": self.latency_total / self.requests if self.requests else 0.0,
            f"{prefix}/latency_max": self.latency_max,
            f"{prefix}/prompt_tokens": self.prompt_tokens,
            f"{prefix}/completion_tokens": self.completion_tokens,
            f"{prefix}/busy_seconds": self.busy_seconds,
            f"{prefix}/in_flight_max": self.in_flight_max,
        }
        record.update({f"{prefix}/failed/{kind}": self.failures[kind] for kind in FAILURE_KINDS})
        if self.batch_items:
            record[f"{prefix}/batch_size_mean"] = self.batch_items / max(1, self.requests)
        return record


class TermStats:
    """A term's running figures; requests in flight are tracked for its busy wall time."""

    def __init__(self) -> None:
        self.figures = TermFigures()
        self._in_flight = 0
        self._busy_since = 0.0

    def request_started(self) -> float:
        now = time.perf_counter()
        if self._in_flight == 0:
            self._busy_since = now
        self._in_flight += 1
        self.figures.requests += 1
        self.figures.in_flight_max = max(self.figures.in_flight_max, self._in_flight)
        return now

    def request_ended(self, started: float) -> None:
        now = time.perf_counter()
        latency = now - started
        self.figures.latency_total += latency
        self.figures.latency_max = max(self.figures.latency_max, latency)
        self._in_flight -= 1
        if self._in_flight == 0:
            self.figures.busy_seconds += now - self._busy_since

    def record(self, judged: Judged) -> None:
        if judged.failure is None:
            self.figures.scored += 1
        else:
            self.figures.failures[judged.failure] += 1

    def take(self) -> TermFigures:
        """The figures since the last call; a busy span still open is split, its part so far
        going to the figures taken."""
        now = time.perf_counter()
        taken, self.figures = self.figures, TermFigures(in_flight_max=self._in_flight)
        if self._in_flight:
            taken.busy_seconds += now - self._busy_since
            self._busy_since = now
        return taken
