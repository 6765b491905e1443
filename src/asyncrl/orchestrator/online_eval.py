"""Online evaluation: held-out examples scored on the training servers while training goes on.

Every `eval.interval` steps (and at step 0 on the starting weights, `eval_base_model`), each
environment's held-out split is generated with the eval sampling settings (greedy by default)
and scored. An evaluation for step s > 0 starts once every server holds weights version >= s,
runs as a background task whose requests join the rollout requests under a cap
(`eval.max_concurrent`), and never holds up a batch. The cap is there for the rollouts' sake:
an evaluation that runs alone (step 0's, and those the run's end waits for) sends every request
at once and the servers batch them as wide as they go. The versions that produced its tokens are
recorded: if a weight update lands mid-evaluation, `version_max` > `version` says so.

Step 0's evaluation is the exception: it runs to the end before the first rollout, so every
token of it is the starting policy's. Beside training it spanned the first updates, and a base
model learns the answer's form in a few of them: Gemma 3 270M's step-0 record read 0.22 over
versions 0-5 where the starting weights score 0.02.

Results are `eval` records of `metrics.jsonl` at step s (`monitor/eval_records.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from asyncrl.config.orchestrator import (
    AdvantageConfig,
    EvalConfig,
    OrchestratorConfig,
    SamplingConfig,
)
from asyncrl.envs.base import Example
from asyncrl.envs.reward_pool import EnvironmentPool
from asyncrl.log import get_logger
from asyncrl.monitor.eval_records import summarize
from asyncrl.monitor.metrics import MetricsWriter
from asyncrl.orchestrator.buffer import Drawn
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.episode import EpisodeSetting, run_episode_group
from asyncrl.orchestrator.generation import RequestRejected
from asyncrl.orchestrator.group import GroupRequest

logger = get_logger(__name__)


@dataclass
class EvalTarget:
    """One environment to evaluate: its examples and the pool that scores them."""

    name: str
    examples: list[Example]
    rewards: EnvironmentPool
    episodes: EpisodeSetting  # how its episodes are played, with the eval's sampling


class _Cap:
    """At most `width` requests at once while `lifted` is False; any number while True."""

    def __init__(self, width: int) -> None:
        self.width, self.used, self.lifted = width, 0, False
        self.changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        async with self.changed:
            await self.changed.wait_for(lambda: self.lifted or self.used < self.width)
            self.used += 1
        try:
            yield
        finally:
            async with self.changed:
                self.used -= 1
                self.changed.notify()

    async def lift(self, lifted: bool) -> None:
        async with self.changed:
            self.lifted = lifted
            self.changed.notify_all()


class OnlineEval:
    def __init__(
        self,
        config: EvalConfig,
        targets: list[EvalTarget],
        clients: ClientPool,
        metrics: MetricsWriter,
        model_name: Callable[[], str],
        first_step: int,
        last_step: int | None,
    ) -> None:
        self.config = config
        self.targets = targets
        self.clients = clients
        self.metrics = metrics
        self.model_name = model_name  # the base model, or the LoRA adapter once loaded
        self.cap = _Cap(config.max_concurrent)
        self.last_step = last_step
        self.next_step = first_step
        self.running: set[asyncio.Task[None]] = set()

    @staticmethod
    def first_step(config: EvalConfig, resumed_at: int) -> int:
        """The first step to evaluate: 0 on the starting weights, or the next multiple of
        `interval` after a resume (the resumed step itself too unless `skip_eval_on_resume`)."""
        if resumed_at == 0:
            return 0 if config.eval_base_model else config.interval
        following = -(-resumed_at // config.interval) * config.interval
        return (
            following + config.interval
            if following == resumed_at and config.skip_eval_on_resume
            else following
        )

    async def evaluate_start(self) -> None:
        """Step 0's evaluation, when due (a fresh run with `eval_base_model`), awaited before any
        rollout: nothing trains while it runs, so it scores the starting weights alone. Its
        failure is logged and the run goes on, as a later evaluation's is: a score is worth
        less than the training it would stop."""
        if self.next_step == 0:
            self.next_step = self.config.interval
            await self.cap.lift(True)  # no rollout runs beside it
            try:
                await self.evaluate(0)
            except Exception as error:  # any failure of a scoring is only logged
                logger.error("online eval failed: %s", error)
            finally:
                await self.cap.lift(False)

    def start_due(self) -> None:
        """Start the evaluation of every due step the servers' weights have reached."""
        version = self.clients.oldest_version()
        while self.next_step <= version and (
            self.last_step is None or self.next_step <= self.last_step
        ):
            task = asyncio.create_task(self.evaluate(self.next_step))
            self.running.add(task)
            task.add_done_callback(self._finished)
            self.next_step += self.config.interval

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("online eval failed: %s", task.exception())

    async def finish(self) -> None:
        """At the end of the run, rollouts over: the evaluations due by now (the final step's
        included) run to the end, uncapped."""
        await self.cap.lift(True)
        self.start_due()
        if self.running:
            await asyncio.gather(*self.running, return_exceptions=True)

    def cancel(self) -> None:
        for task in self.running:
            task.cancel()

    async def evaluate(self, step: int) -> None:
        launch_version = self.clients.oldest_version()
        for target in self.targets:
            answered = await asyncio.gather(
                *(self._example(target, example, launch_version) for example in target.examples)
            )
            results = [samples for samples in answered if samples is not None]
            if not results:
                logger.warning("orchestrator: every eval example of %s was refused by the "
                               "servers at step %d: no eval record", target.name, step)  # fmt: skip
                continue
            summary = summarize(target.name, results, self.config.pass_threshold, launch_version)
            self.metrics.log(step, summary)
            low, high = (
                summary[f"eval/{target.name}/version"],
                summary[f"eval/{target.name}/version_max"],
            )
            if low != high:
                logger.info(
                    "orchestrator: the eval of step %d on %s spans weights versions %d to %d "
                    "(an update landed mid-evaluation)", step, target.name, low, high,
                )  # fmt: skip
        logger.info("orchestrator: evaluated step %d (weights version %d)", step, launch_version)

    async def _example(
        self, target: EvalTarget, example: Example, launch_version: int
    ) -> list[tuple[float, list[int]]] | None:
        """(reward, versions of the model's tokens) of each of the k samples of one example,
        played as in training (`episode.py`) with the eval's sampling; None when a server
        refused the example (a 4xx about its content): it is left out of the record, logged."""
        sampling = self.config.sampling
        seed = None if sampling.seed is None else sampling.seed + example.example_id
        async with self.cap.slot():
            # the name as the request leaves, not as it queued: a LoRA run's first adapter may
            # have been loaded meanwhile, and the server refuses the base name once it is merged
            request = GroupRequest(
                Drawn(0, example), target.name, self.model_name(), sampling.temperature, seed,
                launch_version,
            )  # fmt: skip
            try:
                group = await run_episode_group(request, target.episodes, vocab_size=0)
            except RequestRejected as error:
                if not error.of_example:
                    raise
                where = example.source or example.example_id
                logger.warning("orchestrator: eval example %s of %s left out: %s", where,
                               target.name, error)  # fmt: skip
                return None
        return [
            (reward, [v for v, m in zip(s.policy_versions, s.completion_mask, strict=True) if m])
            for reward, s in zip(group.rewards, group.samples, strict=True)
        ]

    @staticmethod
    def episode_setting(
        config: EvalConfig, training: OrchestratorConfig, setting: EpisodeSetting
    ) -> EpisodeSetting:
        """`setting` (the training one) with the eval's sampling and k (what the eval does not
        set is at its default, not training's: `top_k`, `min_tokens`, `repetition_penalty`),
        no filters, always scored, and outcome advantages (unused: eval trains nothing, and
        neither per-step rewards nor a custom advantage function are asked for)."""
        sampling = SamplingConfig().model_copy(  # a copy: greedy (0) is for eval, not training
            update={
                "temperature": config.sampling.temperature,
                "top_p": config.sampling.top_p,
                "max_tokens": config.sampling.max_tokens or training.sampling.max_tokens,
            }
        )
        evaluation = training.model_copy(
            update={
                "rollouts_per_example": config.rollouts_per_example,
                "sampling": sampling,
                "filters": [],
                "advantage": AdvantageConfig(),
                "mask_truncated_completions": False,
                "buffer": training.buffer.model_copy(update={"skip_verification": False}),
            }
        )
        return replace(setting, config=evaluation)
