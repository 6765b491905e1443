"""A single-turn group: `rollouts_per_example` completions of one prompt as one-turn episodes,
through the one rollout path (`episode.py`); the names a caller of groups needs, in one place."""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs.reward_pool import EnvironmentPool
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.episode import EpisodeSetting, run_episode_group
from asyncrl.orchestrator.generation import ABORT_RETRIES, Completion, GroupAborted
from asyncrl.orchestrator.group import Group, GroupRequest

__all__ = ["Completion", "Group", "GroupAborted", "GroupRequest", "run_group"]


async def run_group(
    request: GroupRequest,
    config: OrchestratorConfig,
    clients: ClientPool,
    rewards: EnvironmentPool,
    vocab_size: int,
    decode: Callable[[list[int]], str] | None = None,
    abort_retries: int = ABORT_RETRIES,
) -> Group:
    """Generate the group on the least-loaded server, score it, and make it training samples.
    A completion the server aborted makes the whole group asked again, `abort_retries` times,
    then `GroupAborted`."""
    setting = EpisodeSetting(
        config, clients, rewards, tokens=None, decode=decode, abort_retries=abort_retries
    )
    return await run_episode_group(request, setting, vocab_size)
