"""`asyncrl orch`: the orchestrator loop, readable top to bottom.

It keeps `batch_size × oversampling_factor` rollouts in flight as groups of
`rollouts_per_example`, scores finished groups, and assembles batch s for the trainer as soon
as enough fresh groups are ready. Staleness is bounded two ways, with k = max_async_level:

- generation for batch s starts only once the servers hold weights version ≥ s − 1 − k (it waits
  for `broadcasts/step_v/STABLE` and loads it, mid-step if need be; newer weights are loaded as
  soon as they appear), and batch s only takes groups in which every rollout's newest token is
  from a version ≥ s − 1 − k;
- a rollout whose oldest token is from a version < s − 1 − max_off_policy_steps is dropped.

With k = 0 this is synchronous on-policy GRPO: every token of batch s was sampled by weights
s − 1, and no group is launched beyond what the step needs (it would span the update and be
dropped). Larger k lets generation run ahead of training.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections import Counter, deque
from pathlib import Path

from transformers import AutoTokenizer

from asyncrl.config.env import EnvConfig
from asyncrl.config.orchestrator import EvalConfig, OrchestratorConfig
from asyncrl.envs import Environment
from asyncrl.envs.model_rewards.pool import model_reward_metrics, with_model_rewards
from asyncrl.envs.multi_turn import is_multi_turn
from asyncrl.envs.remote import RemoteEnvironment, RemotePool, environment_of
from asyncrl.envs.reward_pool import EnvironmentPool, RewardPool
from asyncrl.envs.verifiers.environment import VerifiersEnvironment
from asyncrl.fs import atomic_write_bytes
from asyncrl.log import get_logger
from asyncrl.monitor.metrics import MetricsWriter
from asyncrl.monitor.spans import StepSpans
from asyncrl.orchestrator.buffer import Buffer
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.engine_api import chat_template
from asyncrl.orchestrator.episode import EpisodeSetting, episode_tokens, run_episode_group
from asyncrl.orchestrator.example_checks import Rejections, check_prompt_ids
from asyncrl.orchestrator.generation import GroupAborted, RequestRejected
from asyncrl.orchestrator.group import Group, GroupRequest
from asyncrl.orchestrator.online_eval import EvalTarget, OnlineEval
from asyncrl.orchestrator.progress import maybe_checkpoint, resume
from asyncrl.orchestrator.startup_checks import (
    check_engine_limits,
    refuse_environments_without_step_rewards,
)
from asyncrl.orchestrator.step_metrics import batch_metrics
from asyncrl.orchestrator.temperature import temperature_at
from asyncrl.orchestrator.tied_groups_watch import TiedGroupsWatch
from asyncrl.orchestrator.token_gate import TokenGate
from asyncrl.orchestrator.verifiers_group import verifiers_metrics, verifiers_pool
from asyncrl.orchestrator.weight_sync import WeightSync
from asyncrl.run.layout import metrics_file, samples_file
from asyncrl.run_secret import withhold
from asyncrl.transport.rollout_transport import batch_sender
from asyncrl.transport.run_end import clear_finished, mark_finished
from asyncrl.types import TrainingBatch
from asyncrl.user_code import pass_through

logger = get_logger(__name__)


def run_orchestrator(config: OrchestratorConfig) -> None:
    asyncio.run(Orchestrator(config).run())


class Orchestrator:
    def __init__(self, config: OrchestratorConfig) -> None:
        self.config = config
        self.run_dir = Path(config.output_dir)
        withhold(*config.secret_variables())  # no reward, tool or scorer process inherits them
        pass_through(*config.reward_env_passthrough)
        self.envs = [environment_of(env, config.model.name) for env in config.env]
        self.env_names = [env.name or env.id for env in config.env]
        model = config.model.name
        assert model is not None  # the config refuses a missing model.name
        self.model_name = model
        tokenizer = AutoTokenizer.from_pretrained(model)
        self.vocab_size = len(tokenizer)
        # token text as it appears in completions (the server skips special tokens)
        self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
        steps = config.max_steps or 100
        pool_size = min(
            100_000, max(1024, steps * config.batch_size // config.rollouts_per_example)
        )
        self.buffer = Buffer(self.envs, config.buffer, config.seed, pool_size)
        self.clients = ClientPool(config.client, chat_prompt_ids=chat_template(tokenizer))
        eval_specs = config.eval.env if config.eval else []
        self.eval_envs = [environment_of(spec, config.model.name) for spec in eval_specs]
        self.episode_tokens = episode_tokens(
            [*self.envs, *self.eval_envs],
            [*self.env_names, *(s.name or s.id for s in eval_specs)],
            tokenizer,
        )
        if config.advantage.type == "process":  # evaluated environments are not trained
            refuse_environments_without_step_rewards(self.envs, self.env_names)
        # the verifiers environments' turns come through it (`token_gate.py`)
        self.gate = TokenGate(self.clients, config, lambda: self.weights.request_model)
        self.rewards = [
            self.reward_pool(env, loaded) for env, loaded in zip(config.env, self.envs, strict=True)
        ]
        self.eval_targets = self.eval_targets_of(config.eval) if config.eval else []
        check_prompt_ids(  # what the servers would refuse when drawn, refused now by source
            zip(self.env_names, self.buffer.examples, strict=True),
            self.vocab_size, config.seq_len, config.sampling.max_tokens,
        )  # fmt: skip
        if config.eval is not None:  # held-out examples, with the eval's own max_tokens
            check_prompt_ids(
                [(target.name, target.examples) for target in self.eval_targets],
                self.vocab_size, config.seq_len,
                config.eval.sampling.max_tokens or config.sampling.max_tokens,
            )  # fmt: skip
        self.rejections = Rejections(give_up_after=self.gave_up_on_aborts)
        self.metrics = MetricsWriter(metrics_file(self.run_dir), role="orchestrator")
        self.evaluator: OnlineEval | None = None  # made in `run`, once the resume step is known
        self.seeds = itertools.count()
        # dr_grpo's constant normaliser: the tokens a rollout may generate (an episode's turns
        # together may fill `seq_len`)
        self.generation_budget = (
            config.seq_len
            if any(is_multi_turn(e) or isinstance(e, VerifiersEnvironment) for e in self.envs)
            else config.sampling.max_tokens
        )
        self.aborted_groups = 0  # dropped since the last batch, reported with it
        self.drops: Counter[str] = Counter()  # groups dropped since the last batch, by why
        self.aborted_in_a_row = 0  # since the last group that finished: see `gave_up_on_aborts`
        self.weights = WeightSync(config, self.run_dir, self.clients)

    def reward_pool(self, env: EnvConfig, loaded: Environment) -> EnvironmentPool:
        """Worker processes running the environment's code here, or its env-server's, with the
        model terms of `env.model_rewards` beside them (`envs/model_rewards/pool.py`)."""
        config = self.config
        if isinstance(loaded, VerifiersEnvironment):  # its workers play whole episodes
            return verifiers_pool(loaded, self.gate, config)
        if isinstance(loaded, RemoteEnvironment):
            pool: EnvironmentPool = RemotePool(loaded, config.reward_timeout)
        else:
            pool = RewardPool(
                env.id,
                env.args,
                loaded.rubric,
                num_workers=config.reward_workers,
                timeout=config.reward_timeout,
                memory_limit=config.reward_memory_limit,
                cpu_limit=config.reward_cpu_limit,
            )
        return with_model_rewards(pool, env, f"env `{env.name or env.id}`")

    def eval_targets_of(self, eval_config: EvalConfig) -> list[EvalTarget]:
        """The held-out split of every training environment, then the eval-only ones."""
        count = eval_config.num_examples
        named = [
            *zip(self.env_names, self.envs, self.rewards, strict=True),
            *(
                (spec.name or spec.id, env, self.reward_pool(spec, env))
                for spec, env in zip(eval_config.env, self.eval_envs, strict=True)
            ),
        ]
        return [
            EvalTarget(
                name, env.examples("eval", count), pool, self.episodes(env, pool, eval_config)
            )
            for name, env, pool in named
        ]

    def episodes(
        self, env: Environment, pool: EnvironmentPool, evaluation: EvalConfig | None = None
    ) -> EpisodeSetting:
        """How an environment's episodes are played (one turn each for a single-turn one):
        with the training settings, or with `evaluation`'s sampling."""
        if is_multi_turn(env):
            assert self.episode_tokens is not None  # made when any environment is multi-turn
            setting = EpisodeSetting(
                self.config, self.clients, pool, self.episode_tokens, env.max_turns
            )
        else:
            setting = EpisodeSetting(self.config, self.clients, pool, None, decode=self.decode)
        if evaluation is None:
            return setting
        return OnlineEval.episode_setting(evaluation, self.config, setting)

    async def run(self) -> None:
        config = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        clear_finished(self.run_dir)
        sender = batch_sender(config.rollout_transport, self.run_dir)
        await self.clients.start(self.model_name)
        await check_engine_limits(self.clients, self.model_name)
        pools = {
            id(pool): pool for pool in [*self.rewards, *(t.rewards for t in self.eval_targets)]
        }
        for pool in pools.values():
            await pool.start()
        in_flight: set[asyncio.Task[Group | None]] = set()
        ready: deque[Group] = deque()
        target = round(config.batch_size * config.oversampling_factor)
        resumed = resume(config.ckpt, self.run_dir, self.buffer)
        if resumed.seeds_used is not None:
            self.seeds = itertools.count(resumed.seeds_used)
        step, last_batch = resumed.step + 1, time.monotonic()
        if config.eval is not None:
            self.evaluator = OnlineEval(
                config.eval, self.eval_targets, self.clients,
                MetricsWriter(metrics_file(self.run_dir), role="eval"),
                lambda: self.weights.request_model, OnlineEval.first_step(config.eval, step - 1),
                config.max_steps,
            )  # fmt: skip
        spans = StepSpans()
        tied = TiedGroupsWatch()
        try:
            if self.evaluator is not None:  # inside: a cancel here still closes pools, clients
                await self.evaluator.evaluate_start()
            while config.max_steps is None or step <= config.max_steps:
                with spans.span("wait_weights"):
                    await self.weights.sync(need=step - 1 - config.max_async_level)
                if self.evaluator is not None:
                    self.evaluator.start_due()
                while self.wanted(len(in_flight), len(ready), target):
                    in_flight.add(asyncio.create_task(self.launch(step)))
                with spans.span("wait_rollouts"):
                    done, in_flight = await asyncio.wait(
                        in_flight, timeout=1.0, return_when=asyncio.FIRST_COMPLETED
                    )
                # an error here stops the run; None is a group the server aborted
                ready.extend(group for task in done if (group := task.result()) is not None)
                batch = self.assemble(step, ready)
                if batch is None:
                    continue
                groups, drops = batch
                samples = [s for g in groups for s in g.samples]
                now = time.monotonic()
                temperature = temperature_at(step, config.max_steps, config.sampling)
                # the record first: a restart after a crash between the two forgets the record
                # of a batch never written, and never misses the record of one that was
                metrics = batch_metrics(step, groups, drops, now - last_batch, temperature)
                warning = tied.observe(groups, metrics["orchestrator/sampled_entropy"])
                if warning is not None:
                    logger.warning("orchestrator: %s", warning)
                self.metrics.log(
                    step,
                    metrics
                    | {"orchestrator/tied_streak": tied.streak}
                    | spans.take("orchestrator")
                    | model_reward_metrics(pools.values())
                    | verifiers_metrics(pools.values(), self.gate)
                    | self.rejections.metrics()
                    | self.clients.weights.take(),
                )
                # off the event loop: a zmq send blocks at the high-water mark, a file write
                # takes a while, and rollouts in flight must keep being collected meanwhile
                batch = TrainingBatch(step, samples, self.generation_budget)
                with spans.span("send"):
                    await asyncio.to_thread(sender.send, batch)
                logger.info(
                    "orchestrator: batch %d written (reward %.3f, servers at version %d)",
                    step, sum(r for g in groups for r in g.rewards) / config.batch_size,
                    self.clients.oldest_version(),
                )  # fmt: skip
                self.maybe_write_samples(step, groups)
                seeds_used = next(self.seeds)  # the counter, read without losing a seed
                self.seeds = itertools.count(seeds_used)
                maybe_checkpoint(config.ckpt, self.run_dir, step, self.buffer, seeds_used)
                step, last_batch = step + 1, now
            await asyncio.to_thread(sender.finish)
            for task in in_flight:  # no batch will take them: the engine's time is the evals'
                task.cancel()
            if config.max_steps is not None:  # the run ends with every server on the trained policy
                await self.weights.sync(need=config.max_steps)
                logger.info(
                    "orchestrator: every server holds the final weights (version %d)",
                    self.clients.oldest_version(),
                )
            if self.evaluator is not None:
                await self.evaluator.finish()
            mark_finished(self.run_dir, step - 1)  # a colocated trainer may stop serving now
        finally:
            for task in in_flight:
                task.cancel()
            if self.evaluator is not None:
                self.evaluator.cancel()
            for pool in pools.values():
                await pool.close()
            await self.clients.close()
            self.weights.close()

    async def launch(self, step: int) -> Group | None:
        drawn = self.buffer.draw()
        seed = self.config.sampling.seed
        request = GroupRequest(
            drawn=drawn,
            env_name=self.env_names[drawn.env_index],
            model=self.weights.request_model,
            temperature=temperature_at(step, self.config.max_steps, self.config.sampling),
            seed=None if seed is None else seed + next(self.seeds),
            launch_version=self.clients.oldest_version(),
        )
        env, rewards = self.envs[drawn.env_index], self.rewards[drawn.env_index]
        try:
            group = await run_episode_group(request, self.episodes(env, rewards), self.vocab_size)
        except GroupAborted as error:
            self.aborted_groups += 1
            self.aborted_in_a_row += 1
            if self.aborted_in_a_row >= self.gave_up_on_aborts:
                servers = ", ".join(server.base_url for server in self.clients.servers)
                raise RuntimeError(
                    f"orchestrator: {self.aborted_in_a_row} groups in a row were aborted by the "
                    f"inference servers ({servers}), each on every attempt ({error}): they cut "
                    "every request short (paused with mode=abort and never resumed, or shutting "
                    "down), so no batch can be made"
                ) from error
            logger.warning("orchestrator: a group is dropped: %s", error)
            return None
        except RequestRejected as error:  # the example, not the server: skip it, or stop
            self.rejections.skip(drawn.example, request.env_name, error)
            return None
        self.aborted_in_a_row = 0
        self.rejections.served()
        self.buffer.record(drawn, group.rewards)  # the buffer learns here
        # dynamic sampling: a group whose every advantage is 0 teaches nothing and is dropped
        group.trainable = not (self.config.buffer.online_difficulty_filtering
                               and group.zero_advantage)  # fmt: skip
        return group

    @property
    def gave_up_on_aborts(self) -> int:
        """Aborted groups in a row after which the run stops with the servers' names instead of
        launching groups for ever: four times the groups kept in flight (every group in flight
        may be aborted by one weight update in abort mode, and each is asked `ABORT_RETRIES` + 1
        times, `generation.py`), at least 16."""
        in_flight = self.config.batch_size * self.config.oversampling_factor
        return max(16, 4 * math.ceil(in_flight / self.config.rollouts_per_example))

    def wanted(self, in_flight: int, ready: int, target: int) -> bool:
        """Launch another group? Keep `target` rollouts in flight; on-policy (k = 0), count the
        ready groups too, so that nothing is left generating when the weights change."""
        groups = in_flight + (ready if self.config.max_async_level == 0 else 0)
        return groups * self.config.rollouts_per_example < target

    def assemble(self, step: int, ready: deque[Group]) -> tuple[list[Group], Counter[str]] | None:
        """Batch `step` from the oldest ready groups that are fresh enough, if there are enough."""
        newest_floor = step - 1 - self.config.max_async_level
        oldest_floor = step - 1 - self.config.max_off_policy_steps
        if self.config.max_async_level == 0:
            oldest_floor = newest_floor  # on-policy: no token from older weights either
        drops = self.drops  # counted across calls: most return None, the next batch reports
        if self.aborted_groups:
            drops["aborted"] += self.aborted_groups
            self.aborted_groups = 0
        kept = deque()
        while ready:
            group = ready.popleft()
            if group.stalest_rollout_version < newest_floor:
                drops["async_level"] += 1
            elif group.oldest_token_version < oldest_floor:
                drops["off_policy"] += 1
            elif not group.trainable:
                drops["no_signal"] += 1
            else:
                kept.append(group)
        needed = self.config.batch_size // self.config.rollouts_per_example
        if len(kept) < needed:
            ready.extend(kept)  # not enough yet: keep them for this step
            return None
        chosen = [kept.popleft() for _ in range(needed)]
        ready.extend(kept)
        self.drops = Counter()
        return chosen, drops

    def maybe_write_samples(self, step: int, groups: list[Group]) -> None:
        """`samples/step_N.jsonl`: the batch's prompts, completions and rewards, for the
        trackers' sample tables (and for reading by eye)."""
        interval = self.config.samples_interval
        if interval is None or step % interval:
            return
        rows = [
            {
                "env": group.env_name,
                "example_id": sample.example_id,
                "prompt": self.decode(sample.prompt_ids),
                "completion": self.decode(sample.completion_ids),
                "reward": sample.reward,
                "advantage": sample.advantages[0] if sample.advantages else 0.0,
            }
            for group in groups
            for sample in group.samples
        ]
        text = "".join(json.dumps(row) + "\n" for row in rows)
        atomic_write_bytes(samples_file(self.run_dir, step), text.encode())
