"""An environment's pool with model terms beside its rubric: the orchestrator scores through it
as through any `EnvironmentPool`.

A rollout's rule-based terms (in the environment's workers, here or on its env-server) and its
model terms (a reward model's process, a judge's endpoint, a plugin's process) are scored at the
same time. Each model term's value is logged as `orchestrator/reward/<name>` like any term's,
and weighted into the reward: reward = the rubric's Σ weight·value + Σ weight·value of the model
terms. A model term that fails costs the rollout: its reward is 0, the term is listed among the
rollout's failed terms (`orchestrator/reward_failures`) and counted by kind in the term's own
figures (`orchestrator/model_reward/<name>/failed/<kind>`). A multi-turn environment's turns are
answered by the environment alone; its finished episodes are judged whole.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from typing import Protocol

from asyncrl.config.base import ConfigError
from asyncrl.config.env import EnvConfig
from asyncrl.config.model_rewards import ModelRewardConfig
from asyncrl.envs.base import Example, Messages, RewardFunction
from asyncrl.envs.model_rewards.items import ScoreItem
from asyncrl.envs.model_rewards.judge import JudgeTerm
from asyncrl.envs.model_rewards.scorer_process import ScorerProcess
from asyncrl.envs.model_rewards.stats import Judged, TermFigures, TermStats
from asyncrl.envs.multi_turn import Reply
from asyncrl.envs.reward_pool import EnvironmentPool, RewardResult, within_bounds


class ModelTerm(Protocol):
    name: str
    weight: float
    stats: TermStats

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def score(self, item: ScoreItem) -> Judged: ...


def model_term(config: ModelRewardConfig) -> ModelTerm:
    if config.type == "judge":
        return JudgeTerm(config)
    return ScorerProcess(config)


def scored_by_a_model(completion: object, example: Example) -> float:
    raise RuntimeError("a model term is scored by the orchestrator's ModelRewardPool")


class ModelRewardPool:
    def __init__(self, inner: EnvironmentPool, terms: list[ModelTerm], where: str = "env") -> None:
        names = [term.name for term in inner.rubric]
        for term in terms:
            if term.name in names:
                raise ConfigError(
                    f"{where}.model_rewards: the name `{term.name}` is taken by another term of "
                    f"the rubric ({', '.join(names)}); give it a `name` of its own"
                )
            names.append(term.name)
        self.inner = inner
        self.terms = terms
        self.rubric = [
            *inner.rubric,
            *(RewardFunction(term.name, scored_by_a_model, term.weight) for term in terms),
        ]
        self.failures: Counter[str] = inner.failures

    async def start(self) -> None:
        await self.inner.start()
        for term in self.terms:
            await term.start()

    async def close(self) -> None:
        for term in self.terms:
            await term.close()
        await self.inner.close()

    async def respond(self, messages: Messages, example: Example) -> Reply:
        return await self.inner.respond(messages, example)

    async def score(
        self, completion: str | Messages, example: Example, steps: bool = False
    ) -> RewardResult:
        item = ScoreItem.of(completion, example)
        rule, *judged = await asyncio.gather(
            self.inner.score(completion, example, steps=steps),
            *(term.score(item) for term in self.terms),
        )
        return combine(rule, self.terms, judged)


def combine(rule: RewardResult, terms: list[ModelTerm], judged: list[Judged]) -> RewardResult:
    """The rubric's result with the model terms added; 0 if any of them failed, if the rubric
    itself lost the rollout, or if the total is out of bounds."""
    values, failed = dict(rule.values), list(rule.failed)
    total = rule.reward
    costs_rollout = rule.lost is not None or "out_of_range" in rule.failed
    for term, outcome in zip(terms, judged, strict=True):
        if outcome.value is None:
            values[term.name] = 0.0
            failed.append(term.name)
            costs_rollout = True
            continue
        values[term.name] = outcome.value
        total += term.weight * outcome.value
    if not costs_rollout and not within_bounds(total):
        failed.append("out_of_range")
        costs_rollout = True
    return RewardResult(0.0 if costs_rollout else total, values, failed, rule.lost, rule.steps)


def with_model_rewards(pool: EnvironmentPool, spec: EnvConfig, where: str) -> EnvironmentPool:
    """`pool` itself, or with the model terms `spec.model_rewards` asks for (`where` names the
    config entry in errors: `env[0]`)."""
    if not spec.model_rewards:
        return pool
    return ModelRewardPool(pool, [model_term(config) for config in spec.model_rewards], where)


def model_reward_metrics(pools: Iterable[EnvironmentPool]) -> dict[str, float]:
    """Every model term's figures since the last call, by term name (terms of one name in
    several environments are added up)."""
    figures: dict[str, TermFigures] = {}
    seen: set[int] = set()
    for pool in pools:
        if not isinstance(pool, ModelRewardPool) or id(pool) in seen:
            continue
        seen.add(id(pool))
        for term in pool.terms:
            taken = term.stats.take()
            if term.name in figures:
                figures[term.name].absorb(taken)
            else:
                figures[term.name] = taken
    metrics: dict[str, float] = {}
    for name, term_figures in figures.items():
        metrics.update(term_figures.metrics(name))
    return metrics
