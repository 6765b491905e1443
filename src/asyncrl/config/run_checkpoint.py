"""`asyncrl rl`'s checkpointing, set once for the run: both roles checkpoint and resume by it.

Each role keeps its own copy under its own name (the orchestrator's `ckpt.*`, the trainer's
`save_steps`, `resume_step`, `keep_last`, `keep_interval`), which is what a role started alone
reads; under `asyncrl rl` those are filled from here (`config/rl_wiring.py`, SHARED_FIELDS).
"""

from __future__ import annotations

from pydantic import Field

from asyncrl.config.base import StrictModel


class RunCheckpointConfig(StrictModel):
    interval: int | None = Field(
        None,
        gt=0,
        description="Both roles checkpoint every N steps (null: never, unless restarts are on: "
        "then the orchestrator every step and the trainer every 25).",
    )
    orchestrator_interval: int | None = Field(
        None,
        gt=0,
        description="The orchestrator's own interval when it should differ from `interval` "
        "(its state is a few kilobytes: every step lets a restarted orchestrator lose nothing).",
    )
    resume_step: int | None = Field(
        None, ge=-1, description="Both roles resume from this step (-1: the latest complete)."
    )
    keep_last: int | None = Field(
        None, gt=0, description="Each role keeps at most N recent checkpoints."
    )
    keep_interval: int | None = Field(
        None, gt=0, description="Each role keeps the checkpoints of every N-th step for good."
    )
