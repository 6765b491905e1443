"""One group: `rollouts_per_example` completions of one prompt, generated on one server,
scored, given group-relative advantages and filtered, as training samples."""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs.reward_pool import EnvironmentPool, RewardResult
from asyncrl.orchestrator.advantage import group_advantages, process_advantages
from asyncrl.orchestrator.buffer import Drawn
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.filters import apply_filters
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
        return all(a == 0.0 for s in self.samples for a in s.advantages[:1])


@dataclass(frozen=True)
class Completion:
    """One choice of a chat or text completion response, in one shape."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    prompt_ids: list[int]
    policy_versions: list[int] | None  # embedded engine only; vLLM has no such field

    @classmethod
    def parse(cls, choice: dict[str, Any], response: dict[str, Any]) -> Completion:
        if "message" in choice:  # chat: prompt ids at the top level, logprobs under `content`
            text = choice["message"]["content"] or ""
            logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
            prompt_ids = response["prompt_token_ids"]
        else:
            text = choice["text"]
            logprobs = list(choice["logprobs"]["token_logprobs"])
            prompt_ids = choice["prompt_token_ids"]
        return cls(
            choice["index"], text, choice["token_ids"], logprobs, choice["finish_reason"],
            prompt_ids, choice.get("policy_versions"),
        )  # fmt: skip


def per_token_advantages(
    choices: list[Completion],
    scored: list[RewardResult],
    lengths: list[int],
    config: OrchestratorConfig,
    decode: Callable[[list[int]], str] | None,
) -> list[list[float]]:
    """Outcome advantages spread over each completion's tokens, or (advantage.type `process`)
    per-token advantages from per-step rewards, step ends mapped from characters to tokens."""
    if config.advantage.type != "process":
        outcome = group_advantages([r.reward for r in scored], lengths, config.advantage)
        return [[value] * n for value, n in zip(outcome, lengths, strict=True)]
    if decode is None:
        raise ValueError("process advantages need a tokenizer to map characters to tokens")
    steps_in_tokens = []
    for choice, result in zip(choices, scored, strict=True):
        ends, total = [], 0
        for token in choice.token_ids:  # character offset at the end of every token
            # (`decode` must skip special tokens, as the completion text does)
            total += len(decode([token]))
            ends.append(total)
        steps_in_tokens.append(
            [(bisect.bisect_left(ends, end), reward) for end, reward in result.steps]
        )
    return process_advantages(steps_in_tokens, lengths)


@dataclass(frozen=True)
class GroupRequest:
    drawn: Drawn
    env_name: str
    model: str  # the served name to ask for (base model, or the LoRA adapter once loaded)
    temperature: float
    seed: int | None
    launch_version: int  # used for every token when the server reports no per-token versions


ABORT_RETRIES = 2  # a pause with mode=abort, a server shutting down: worth asking again


class GroupAborted(Exception):
    """The server aborted a completion of the group on every attempt: nothing to train."""


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
    Whether the group trains (the buffer's difficulty filter) is the caller's to decide.

    A completion the server aborted is cut short, not finished: the whole group is generated
    again (its siblings are its baseline), `abort_retries` times, then `GroupAborted`."""
    route, body = request_body(request, config)
    retries = 0
    started = time.perf_counter()
    while True:
        _, response = await clients.generate_anywhere(route, body, cost=config.rollouts_per_example)
        choices = sorted(
            (Completion.parse(choice, response) for choice in response["choices"]),
            key=lambda choice: choice.index,
        )
        if not any(choice.finish_reason == "abort" for choice in choices):
            break
        if retries == abort_retries:
            raise GroupAborted(f"the server aborted the group {retries + 1} times")
        retries += 1
    generated = time.perf_counter()
    scored = await score(choices, request, config, rewards)
    group = to_group(request, choices, scored, config, vocab_size, decode)
    group.aborted_retries = retries
    group.generate_seconds = generated - started
    group.score_seconds = time.perf_counter() - generated
    return group


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
    else:
        route = "chat/completions"
        body.update(messages=example.prompt, logprobs=True)
    if sampling.max_tokens is not None:
        body["max_tokens"] = sampling.max_tokens
    if request.seed is not None:
        body["seed"] = request.seed
    return route, body


async def score(
    choices: list[Completion],
    request: GroupRequest,
    config: OrchestratorConfig,
    rewards: EnvironmentPool,
) -> list[RewardResult]:
    """Each completion's reward (and per-step rewards for process advantages); 0 for all with
    `buffer.skip_verification`."""
    if config.buffer.skip_verification:
        return [RewardResult(0.0, {}) for _ in choices]
    process = config.advantage.type == "process"
    return list(
        await asyncio.gather(
            *(rewards.score(c.text, request.drawn.example, steps=process) for c in choices)
        )
    )


def to_group(
    request: GroupRequest,
    choices: list[Completion],
    scored: list[RewardResult],
    config: OrchestratorConfig,
    vocab_size: int,
    decode: Callable[[list[int]], str] | None,
) -> Group:
    """Scored completions as training samples: advantages per token, filters applied, each
    token's policy version (the launch version where the server reports none)."""
    lengths = [len(choice.token_ids) for choice in choices]
    token_advantages = per_token_advantages(choices, scored, lengths, config, decode)
    group = Group(
        drawn=request.drawn,
        env_name=request.env_name,
        samples=[],
        rewards=[r.reward for r in scored],
        values=[r.values for r in scored],
        truncated=[choice.finish_reason == "length" for choice in choices],
        reward_failures=sum(len(r.failed) + (r.lost is not None) for r in scored),
    )
    for choice, result, advantages, truncated in zip(
        choices, scored, token_advantages, group.truncated, strict=True
    ):
        token_ids, logprobs = choice.token_ids, choice.logprobs
        versions = choice.policy_versions or [request.launch_version] * len(token_ids)
        outcome = apply_filters(
            token_ids, logprobs, truncated, config.filters, vocab_size,
            config.mask_truncated_completions,
        )  # fmt: skip
        group.filter_hits.update(name for name, hit in outcome.hits.items() if hit)
        group.samples.append(
            TrainingSample(
                prompt_ids=choice.prompt_ids,
                completion_ids=token_ids,
                completion_mask=[outcome.train] * len(token_ids),
                inference_logprobs=logprobs,
                advantages=advantages,
                policy_versions=versions,
                temperature=request.temperature,
                env=request.env_name,
                task=request.drawn.example.task,
                example_id=request.drawn.example.example_id,
                reward=result.reward,
            )
        )
    return group
