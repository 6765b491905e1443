"""What a group is and how it is asked for: `rollouts_per_example` completions of one prompt
(`request_body`; the request itself is `generation.generate`'s), collected as a `Group` of
training samples with the counts the step's metrics read. Single-turn and multi-turn groups
are both groups of episodes (`episode.py`)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.orchestrator.buffer import Drawn
from asyncrl.types import TrainingSample


@dataclass
class Group:
    drawn: Drawn
    env_name: str
    samples: list[TrainingSample]
    rewards: list[float]
    values: list[dict[str, float]]  # each completion's value of each reward function
    truncated: list[bool]
    trainable: bool = True  # False: skipped by online difficulty filtering (set by the caller)
    filter_hits: Counter[str] = field(default_factory=Counter)
    reward_failures: int = 0
    aborted_retries: int = 0  # times the server aborted a completion and the group was redone
    finished_at: float = field(default_factory=time.monotonic)
    # multi-turn episodes only (`episode.py`): how each ended, model turns, tokens per turn
    episode_ends: Counter[str] = field(default_factory=Counter)
    turns: list[int] = field(default_factory=list)
    turn_lengths: list[int] = field(default_factory=list)
    tool_calls: Counter[str] = field(default_factory=Counter)  # "<tool>", "<tool>/<error kind>"
    cut_turns: int = 0  # model turns cut by max_tokens (the episode went on)
    generate_seconds: float = 0.0  # from the request to the last completion (turns: episodes)
    score_seconds: float = 0.0  # from the completions to their rewards

    @property
    def oldest_token_version(self) -> int:
        """The oldest weights that produced any token of the group."""
        return min(min(s.policy_versions, default=0) for s in self.samples)

    @property
    def stalest_rollout_version(self) -> int:
        """The newest token of the group's stalest rollout: a short completion can finish on old
        weights while its siblings continue on new ones, so the bound must hold per rollout."""
        return min(max(s.policy_versions, default=0) for s in self.samples)

    @property
    def zero_advantage(self) -> bool:
        """Every token's advantage is 0 (a group that scored alike, under any advantage that
        centres rewards; per-step advantages can differ within a completion)."""
        return all(a == 0.0 for s in self.samples for a in s.advantages)


@dataclass(frozen=True)
class GroupRequest:
    drawn: Drawn
    env_name: str
    model: str  # the served name to ask for (base model, or the LoRA adapter once loaded)
    temperature: float
    seed: int | None
    launch_version: int  # used for every token when the server reports no per-token versions


def request_body(request: GroupRequest, config: OrchestratorConfig) -> tuple[str, dict[str, Any]]:
    """The route and body asking for `rollouts_per_example` completions of the example: token
    ids to the completions route when the example is pre-tokenized, messages to chat else."""
    sampling = config.sampling
    example = request.drawn.example
    body: dict[str, Any] = {
        "model": request.model,
        "n": config.rollouts_per_example,
        "temperature": request.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "min_tokens": sampling.min_tokens,
        "repetition_penalty": sampling.repetition_penalty,
        "return_token_ids": True,
    }
    if example.prompt_token_ids is not None:
        route = "completions"
        body.update(prompt=example.prompt_token_ids, logprobs=0)
    elif example.prompt_text is not None:  # a base model's plain prompt: no chat template
        route = "completions"
        body.update(prompt=example.prompt_text, logprobs=0)
    else:
        route = "chat/completions"
        body.update(messages=example.prompt, logprobs=True)
    if example.stop:
        body["stop"] = list(example.stop)
        if example.stop_kept:
            body["include_stop_str_in_output"] = True
    if sampling.max_tokens is not None:
        body["max_tokens"] = sampling.max_tokens
    if request.seed is not None:
        body["seed"] = request.seed
    return route, body
