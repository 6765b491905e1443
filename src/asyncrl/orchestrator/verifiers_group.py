"""A group of a verifiers environment's episodes, made training samples.

`rollouts_per_example` episodes of the drawn task are played by the environment's workers
(`envs/verifiers/pool.py`), each driving the policy through the token gate
(`token_gate.py`). Each trainable branch of an episode's trace becomes one `TrainingSample`:

- its tokens up to the first sampled one are the prompt, the rest the completion;
- every span of sampled tokens must be a turn the gate served, exactly: the ids before it are
  that turn's prompt and the span is its sampled ids. The logprobs and policy versions are the
  gate's, so an environment cannot change what is trained; a branch that fails the check fails
  its episode (`token_mismatch`);
- only sampled tokens are in the loss (`completion_mask`): the template's, the tools' and the
  environment's tokens are not; a token not sampled takes the version of the token before it;
- the episode's reward is the sum of its trainable traces' rewards (verifiers' `trace.reward`:
  Σ score × weight), each reward function's score logged under its name; the advantage is the
  group's, on every token of every branch of the episode.

An episode that failed (the environment, its tools, a worker, the gate, a mismatch) scores 0
and is not trained on; it is counted by reason in the pool. An episode that played no turn
(it failed before the first) keeps its place in the group with a one-token sample outside the
loss. How each episode ended is reported as multi-turn episodes' are (`episode/ended_by/...`):
`done` (the agent answered), `max_turns`, `budget` (token limits, the context full),
`timeout` (a verifiers stage deadline), a stop of the environment's own, or `env_<failure>`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs.verifiers.environment import VerifiersEnvironment
from asyncrl.envs.verifiers.pool import Played, VerifiersPool
from asyncrl.envs.verifiers.record import Branch, EpisodeRecord
from asyncrl.orchestrator.advantage import group_advantages
from asyncrl.orchestrator.filters import apply_filters
from asyncrl.orchestrator.group import Group, GroupRequest
from asyncrl.orchestrator.token_gate import TokenGate, Turn
from asyncrl.types import TrainingSample

TOKEN_BUDGET_STOPS = {"max_input_tokens", "max_output_tokens", "max_total_tokens"}


class Mismatch(ValueError):
    """A branch's sampled tokens are not what the gate served."""


@dataclass
class Scored:
    """One episode, ready for the group: its samples' token lists, its reward and counts."""

    branches: list[tuple[list[int], list[bool], list[float], list[int]]] = field(
        default_factory=list
    )  # (token ids, sampled, logprobs, versions), each from the first sampled token's prompt on
    reward: float = 0.0
    values: dict[str, float] = field(default_factory=dict)
    reward_failures: int = 0
    failed: bool = False
    ended_by: str = "done"
    turns: int = 0
    turn_lengths: list[int] = field(default_factory=list)
    tool_calls: Counter[str] = field(default_factory=Counter)
    cut_turns: int = 0
    scoring_seconds: float = 0.0


async def run_verifiers_group(
    request: GroupRequest, config: OrchestratorConfig, pool: VerifiersPool, vocab_size: int
) -> Group:
    started = time.perf_counter()
    seed = request.seed
    played = await asyncio.gather(
        *(
            pool.run_episode(
                request.drawn.example,
                request.temperature,
                None if seed is None else seed + 7919 * index,
                config.sampling,
            )
            for index in range(config.rollouts_per_example)
        )
    )
    scored = [score_episode(p, pool, request.launch_version) for p in played]
    group = to_group(request, scored, config, vocab_size, pool)
    group.generate_seconds = time.perf_counter() - started
    group.score_seconds = sum(s.scoring_seconds for s in scored) / max(1, len(scored))
    return group


def score_episode(played: Played, pool: VerifiersPool, launch_version: int) -> Scored:
    if played.record is None:
        return Scored(failed=True, ended_by=f"env_{played.failure}")
    episode = played.record
    traces = [trace for trace in episode.traces if trace.trainable]
    scored = Scored(turns=sum(t.turns for t in traces))
    for trace in traces:
        scored.tool_calls.update(trace.tool_calls)
        scored.scoring_seconds += trace.seconds.get("scoring", 0.0)
        for name, (score, weight) in trace.rewards.items():
            scored.values[name] = scored.values.get(name, 0.0) + (score or 0.0)
            if score is None:
                scored.reward_failures += 1
            else:
                scored.reward += score * weight
    failure = episode_failure(episode)
    if failure is None and len(traces) != 1:
        failure = "multiple_traces" if traces else "no_trace"
        pool.fail(failure, f"an episode has {len(traces)} trainable traces; one is trained")
    if failure is None:
        try:
            scored.branches = [
                exact_branch(b, played.turns, launch_version) for b in traces[0].branches
            ]
        except Mismatch as error:
            failure = "token_mismatch"
            pool.fail(failure, str(error))
        except (ValueError, IndexError) as error:
            failure = "malformed_record"
            pool.fail(failure, f"an episode's record is inconsistent: {error}")
    if failure is not None:
        return Scored(
            failed=True,
            ended_by=f"env_{failure}",
            values=scored.values,
            turns=scored.turns,
            tool_calls=scored.tool_calls,
        )
    trace = traces[0]
    scored.ended_by = ending(trace.stop, trace.context_full)
    for turn in played.turns:
        scored.turn_lengths.append(len(turn.completion_ids))
        scored.cut_turns += turn.finish_reason == "length"
    scored.cut_turns -= bool(played.turns) and played.turns[-1].finish_reason == "length"
    return scored


def episode_failure(episode: EpisodeRecord) -> str | None:
    """The first error type of a failed episode (counted by the pool as it arrived)."""
    if episode.ok and all(trace.errors == [] for trace in episode.traces if trace.trainable):
        return None
    kinds = [*episode.errors, *(k for t in episode.traces if t.trainable for k in t.errors)]
    return kinds[0] if kinds else "failed"


def ending(stop: str | None, context_full: bool) -> str:
    if context_full or stop in TOKEN_BUDGET_STOPS:
        return "budget"
    if stop is None or stop == "agent_completed":
        return "done"
    if stop.endswith("_timeout"):
        return "timeout"
    return stop


def exact_branch(
    branch: Branch, turns: list[Turn], launch_version: int
) -> tuple[list[int], list[bool], list[float], list[int]]:
    """The branch from its first sampled token's prompt on, with the gate's logprobs and
    versions; `Mismatch` unless every sampled span is a turn the gate served."""
    ids, sampled = branch.token_ids, branch.sampled
    if len(sampled) != len(ids) or not all(isinstance(t, int) and t >= 0 for t in ids):
        raise ValueError(f"{len(ids)} token ids, {len(sampled)} sampled flags")
    served = {(len(t.prompt_ids), tuple(t.completion_ids)): t for t in turns}
    logprobs = [0.0] * len(ids)
    versions: list[int | None] = [None] * len(ids)
    start = 0
    while start < len(ids):
        if not sampled[start]:
            start += 1
            continue
        end = start
        while end < len(ids) and sampled[end]:
            end += 1
        turn = served.get((start, tuple(ids[start:end])))
        if turn is None or turn.prompt_ids != ids[:start]:
            raise Mismatch(
                f"tokens {start}-{end} of a branch were not sampled by the policy "
                "as the branch has them (no turn the gate served matches)"
            )
        logprobs[start:end] = turn.logprobs
        versions[start:end] = turn.versions
        start = end
    if not any(sampled):
        return [], [], [], []
    first = sampled.index(True)
    last = launch_version
    filled = []
    for version in versions[first:]:
        last = version if version is not None else last
        filled.append(last)
    return ids, sampled, logprobs, [launch_version] * first + filled


def to_group(
    request: GroupRequest,
    scored: list[Scored],
    config: OrchestratorConfig,
    vocab_size: int,
    pool: VerifiersPool,
) -> Group:
    rewards = [s.reward for s in scored]
    names = [term.name for term in pool.rubric]
    model_tokens = [sum(sum(b[1]) for b in s.branches) for s in scored]
    advantages = group_advantages(rewards, model_tokens, config.advantage)
    group = Group(
        drawn=request.drawn,
        env_name=request.env_name,
        samples=[],
        rewards=rewards,
        values=[{name: s.values.get(name, 0.0) for name in {*names, *s.values}} for s in scored],
        truncated=[s.ended_by == "budget" for s in scored],
        reward_failures=sum(s.reward_failures for s in scored),
        episode_ends=Counter(s.ended_by for s in scored),
        turns=[s.turns for s in scored],
        turn_lengths=[n for s in scored for n in s.turn_lengths],
        tool_calls=sum((s.tool_calls for s in scored), Counter()),
        cut_turns=sum(s.cut_turns for s in scored),
    )
    for episode, advantage in zip(scored, advantages, strict=True):
        for sample in samples_of(episode, advantage, request, config, vocab_size, group):
            group.samples.append(sample)
    return group


def samples_of(
    episode: Scored,
    advantage: float,
    request: GroupRequest,
    config: OrchestratorConfig,
    vocab_size: int,
    group: Group,
) -> list[TrainingSample]:
    example = request.drawn.example
    common: dict[str, Any] = {
        "temperature": request.temperature,
        "env": request.env_name,
        "task": example.task,
        "example_id": example.example_id,
        "reward": episode.reward,
    }
    branches = [b for b in episode.branches if b[0]]
    if not branches:  # no turn was played: a place in the group, outside the loss
        return [
            TrainingSample(
                prompt_ids=[0],
                completion_ids=[0],
                completion_mask=[False],
                inference_logprobs=[0.0],
                advantages=[advantage],
                policy_versions=[request.launch_version],
                **common,
            )
        ]
    samples = []
    for ids, sampled, logprobs, versions in branches:
        first = sampled.index(True)
        model_ids = [t for t, s in zip(ids, sampled, strict=True) if s]
        model_logprobs = [lp for lp, s in zip(logprobs, sampled, strict=True) if s]
        outcome = apply_filters(
            model_ids,
            model_logprobs,
            episode.ended_by == "budget",
            config.filters,
            vocab_size,
            config.mask_truncated_completions,
        )
        group.filter_hits.update(name for name, hit in outcome.hits.items() if hit)
        train = outcome.train and not episode.failed
        completion = ids[first:]
        samples.append(
            TrainingSample(
                prompt_ids=ids[:first],
                completion_ids=completion,
                completion_mask=[train and s for s in sampled[first:]],
                inference_logprobs=logprobs[first:],
                advantages=[advantage] * len(completion),
                policy_versions=versions[first:],
                **common,
            )
        )
    return samples


def verifiers_pool(
    environment: VerifiersEnvironment, gate: TokenGate, config: OrchestratorConfig
) -> VerifiersPool:
    """The workers of a verifiers environment, its turns generated through `gate`."""
    assert config.model.name is not None  # the config refuses a missing model.name
    return VerifiersPool(environment, gate, served_name=config.model.name)


def verifiers_metrics(pools: Iterable[object], gate: TokenGate) -> dict[str, float]:
    """Every verifiers environment's figures since the last call, and the gate's refusals."""
    metrics: dict[str, float] = {}
    for pool in {id(p): p for p in pools if isinstance(p, VerifiersPool)}.values():
        assert isinstance(pool, VerifiersPool)
        metrics |= pool.metrics()
    return metrics | gate.metrics()
