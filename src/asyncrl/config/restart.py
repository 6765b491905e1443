"""Configuration of automatic restarts in `asyncrl rl`: how often a dead or hung role is started
again, how long to wait first, and when a silent role counts as hung."""

from __future__ import annotations

from pydantic import Field

from asyncrl.config.base import StrictModel
from asyncrl.heartbeat import INTERVAL_S as HEARTBEAT_INTERVAL_S

# with restarts on and no checkpoint interval given, what a restarted role resumes from
ORCHESTRATOR_CHECKPOINT_INTERVAL = 1  # its state is a few kilobytes of JSON
TRAINER_CHECKPOINT_INTERVAL = 25  # weights and optimizer: a restart redoes at most 24 steps
CHECKPOINTS_KEPT = 2


class RestartConfig(StrictModel):
    max_restarts: int = Field(
        3,
        ge=0,
        description="Restarts allowed per role before the run gives up (0 = a dead role stops "
        "the run, for a manual `orchestrator.ckpt.resume_step: -1`).",
    )
    backoff: float = Field(
        2.0, ge=0, description="Seconds before a role's first restart; doubled for each next one."
    )
    hang_timeout: float | None = Field(
        120.0,
        ge=2 * HEARTBEAT_INTERVAL_S,
        description="Seconds without a heartbeat from a live role (stopped, or frozen) before "
        "it is killed and restarted (null = never); at least two heartbeats (2 s).",
    )
