"""What crosses between a verifiers worker and its pool: one JSON line each way per message.

Typed structs (msgspec): whatever a worker writes is decoded against them, so a line that is not
one of these (a worker broken by the code it runs) is refused as malformed instead of being
trusted. A worker sends only plain data: token ids, masks and logprobs per branch, rewards and
metrics by name; never a verifiers object.
"""

from __future__ import annotations

from typing import Any

import msgspec

GATE_KEY_VAR = "ASYNCRL_GATE_API_KEY"  # the token gate's key, in a worker's environment only


class Branch(msgspec.Struct, frozen=True):
    """One root-to-leaf path of a trace: one training sample."""

    token_ids: list[int]
    sampled: list[bool]  # True where the policy sampled the token (aligned with token_ids)
    logprobs: list[float]  # the worker's copy; the gate's records are what is trained


class TraceRecord(msgspec.Struct, frozen=True):
    id: str  # the trace id: the session the gate recorded its turns under
    trainable: bool
    branches: list[Branch]
    rewards: dict[str, tuple[float | None, float]]  # name -> (score, weight); None: it failed
    metrics: dict[str, float | None]
    stop: str | None  # agent_completed, max_turns, <stage>_timeout...
    errors: list[str]  # the types of the errors recorded on the trace
    error: str  # the first error's message ("" when none), for the log
    turns: int
    tool_calls: dict[str, int]  # "<tool>" per call, "<tool>/<error>" per failed one
    context_full: bool  # a model call was refused because the conversation no longer fit
    seconds: dict[str, float]  # setup, model, harness, scoring


class EpisodeRecord(msgspec.Struct, frozen=True):
    ok: bool
    traces: list[TraceRecord]
    errors: list[str]  # episode-level error types (the env's run/finalize hooks)
    error: str


class Task(msgspec.Struct, frozen=True):
    """A task as the orchestrator sees it: its key, name and prompt for display, and its data
    (verifiers' `TaskData`, as JSON) for a remote environment server."""

    key: str
    name: str
    prompt: list[dict[str, str]]
    data: dict[str, Any]


# worker -> pool
class Described(msgspec.Struct, frozen=True, tag="described"):
    train: list[Task]
    eval: list[Task]
    rewards: dict[str, float]  # the task's reward functions and their weights
    notes: list[str]  # what the worker changed or skipped, said once at start-up


class Refused(msgspec.Struct, frozen=True, tag="refused"):
    reason: str


class Ready(msgspec.Struct, frozen=True, tag="ready"):
    pass


class Beat(msgspec.Struct, frozen=True, tag="beat"):
    pass


class Started(msgspec.Struct, frozen=True, tag="trace"):
    run: str
    trace: str  # the session id its model calls carry (`X-Session-ID`)


class Done(msgspec.Struct, frozen=True, tag="done"):
    run: str
    episode: EpisodeRecord


class Failed(msgspec.Struct, frozen=True, tag="failed"):
    run: str
    reason: str  # the metric it counts under
    message: str


FromWorker = Described | Refused | Ready | Beat | Started | Done | Failed


# pool -> worker
class Run(msgspec.Struct, frozen=True, tag="run"):
    run: str
    key: str  # the task's key in the worker's own taskset
    temperature: float
    data: dict[str, Any] | None = None  # its data, for a task the worker does not hold


class Cancel(msgspec.Struct, frozen=True, tag="cancel"):
    run: str


ToWorker = Run | Cancel
