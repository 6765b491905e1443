"""A reward-model or plugin term from the orchestrator's side: its scorer runs in a process of its
own (`scorer_worker`), fed batches, so a forward pass never holds up the event loop.

Rollouts are batched as they come: a rollout asked for while a batch is being scored waits for
the next, which takes every rollout waiting by then. A group's completions are asked for
together (`asyncio.gather`), so a group is scored in one batch, and groups that finish while
the scorer is busy share the next. The process is started, and loaded, before the run begins: a
scorer that cannot load (a wrong path, a plugin that raises) stops start-up with its traceback.
A batch that takes longer than `timeout`, a process that dies, or a scorer that raises costs
that batch's rollouts (counted `timeout`, `unavailable`, `error`); the process is then replaced
before the next batch. A score that is not a finite number costs its rollout (`unparseable`).

The process runs a user's code (a plugin, a hub model's): it starts as a reward worker does
(`user_code.py`: an allowlist of variables, never the run's secret or keys; no capability that
reads another process; SIGKILL when the orchestrator dies). A reward model on `cuda` sees the
GPUs `asyncrl rl` set aside for it (`$ASYNCRL_SCORER_DEVICES`, `gpu_placement.py`) as its
CUDA_VISIBLE_DEVICES, where the orchestrator itself sees none (`scorer_environment`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from asyncrl.config.base import ConfigError
from asyncrl.config.model_rewards import (
    SCORER_DEVICES_ENV,
    PluginTermConfig,
    RewardModelTermConfig,
)
from asyncrl.envs.model_rewards.items import ScoreItem
from asyncrl.envs.model_rewards.stats import Judged, TermStats
from asyncrl.log import get_logger
from asyncrl.processes import kill_session
from asyncrl.user_code import start_user_code, user_code_environment

logger = get_logger(__name__)

LOAD_TIMEOUT = 600.0  # seconds a scorer may take to load its model
LINE_LIMIT = 2**22  # bytes in one answer line
KILL_GRACE = 2.0


class ScorerProcess:
    def __init__(
        self, config: RewardModelTermConfig | PluginTermConfig, load_timeout: float = LOAD_TIMEOUT
    ) -> None:
        self.config = config
        self.name = config.name
        self.weight = config.weight
        self.load_timeout = load_timeout
        self.stats = TermStats()
        self.process: asyncio.subprocess.Process | None = None
        self.waiting: list[tuple[ScoreItem, asyncio.Future[Judged]]] = []
        self.runner: asyncio.Task[None] | None = None
        self._logged: set[str] = set()

    @property
    def what(self) -> str:
        source = getattr(self.config, "model", None) or getattr(self.config, "import_path", "")
        return f"{self.config.type} `{self.name}` ({source})"

    async def start(self) -> None:
        """Start the scorer and wait until it has loaded; one that cannot load is a config error."""
        problem = await self._spawn()
        if problem is not None:
            raise ConfigError(f"{self.what} did not load:\n{problem}")
        logger.info("%s: loaded in its own process (pid %d)", self.what, self.process.pid)  # type: ignore[union-attr]

    async def close(self) -> None:
        if self.runner is not None:
            self.runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.runner
        await self._kill()

    async def score(self, item: ScoreItem) -> Judged:
        """This rollout's score, from the next batch the scorer runs."""
        future: asyncio.Future[Judged] = asyncio.get_running_loop().create_future()
        self.waiting.append((item, future))
        if self.runner is None or self.runner.done():
            self.runner = asyncio.create_task(self._run())
        return await future

    async def _run(self) -> None:
        """Score what is waiting, batch after batch, until nothing is."""
        while self.waiting:
            batch, self.waiting = self.waiting, []
            try:
                results = await self._score_batch([item for item, _ in batch])
            except BaseException as error:  # a bug or a cancellation: no caller waits forever
                for _, future in batch:
                    if future.done():
                        continue
                    if isinstance(error, Exception):
                        future.set_exception(error)
                    else:
                        future.cancel()
                raise
            for (_, future), judged in zip(batch, results, strict=True):
                self.stats.record(judged)
                if not future.done():  # its caller may have been cancelled meanwhile
                    future.set_result(judged)

    async def _score_batch(self, items: list[ScoreItem]) -> list[Judged]:
        if self.process is None or self.process.returncode is not None:
            problem = await self._spawn()
            if problem is not None:
                return self._fail(items, "unavailable", f"could not be restarted:\n{problem}")
        process = self.process
        assert process is not None and process.stdin is not None and process.stdout is not None
        self.stats.figures.batch_items += len(items)
        started = self.stats.request_started()
        try:
            process.stdin.write(
                json.dumps({"items": [i.as_json() for i in items]}).encode() + b"\n"
            )
            await process.stdin.drain()
            line = await asyncio.wait_for(process.stdout.readline(), self.config.timeout)
        except TimeoutError:
            await self._kill()
            return self._fail(items, "timeout", f"a batch took over {self.config.timeout} s")
        except (ConnectionError, ValueError) as error:  # ValueError: a line over the limit
            await self._kill()
            return self._fail(items, "error", f"broke the protocol ({error})")
        finally:
            self.stats.request_ended(started)
        if not line:
            code = await process.wait()
            await self._kill()
            return self._fail(items, "unavailable", f"its process exited ({code})")
        return self._read(items, line)

    def _read(self, items: list[ScoreItem], line: bytes) -> list[Judged]:
        try:
            answer: dict[str, Any] = json.loads(line)
            if "error" in answer:
                return self._fail(items, "error", f"raised:\n{answer['error']}")
            scores = answer["scores"]
            if len(scores) != len(items):
                raise ValueError(f"{len(scores)} scores for {len(items)} rollouts")
        except (ValueError, KeyError, TypeError) as error:
            return self._fail(items, "error", f"answered something that is not scores ({error})")
        self.stats.figures.prompt_tokens += int(answer.get("tokens") or 0)
        judged = [
            Judged(float(s)) if s is not None else Judged.failed("unparseable") for s in scores
        ]
        if any(j.failure for j in judged):
            self._log_once("unparseable", "gave a score that is not a finite number")
        return judged

    def _fail(self, items: list[ScoreItem], kind: str, message: str) -> list[Judged]:
        self._log_once(kind, message)
        return [Judged.failed(kind) for _ in items]

    def _log_once(self, kind: str, message: str) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            logger.warning("%s %s; its rollouts score 0", self.what, message)

    async def _spawn(self) -> str | None:
        """A fresh process with the scorer loaded; None, or why it is not ready."""
        await self._kill()
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "asyncrl.envs.model_rewards.scorer_worker",
            json.dumps(self.config.model_dump(mode="json")),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            start_new_session=True, limit=LINE_LIMIT, preexec_fn=start_user_code,
            env=scorer_environment(self.config, os.environ),
        )  # fmt: skip
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), self.load_timeout)
            ready = json.loads(line) if line else {"error": "it exited while loading"}
        except TimeoutError:
            ready = {"error": f"it did not load within {self.load_timeout} s"}
        except ValueError as error:
            ready = {"error": f"it answered something unreadable ({error})"}
        if ready.get("ready") is True:
            return None
        await self._kill()
        return str(ready.get("error") or ready)

    async def _kill(self) -> None:
        """Kill the scorer's whole process group; never wait on pipes a stray child holds."""
        process, self.process = self.process, None
        if process is not None:
            await kill_session(process, self.what, KILL_GRACE)


def scorer_environment(
    config: RewardModelTermConfig | PluginTermConfig, environ: Mapping[str, str]
) -> dict[str, str]:
    """The scorer process's environment: the orchestrator's (`environ`) less its secrets, its
    threads, and for a reward model on `cuda` the GPUs set aside for it (`$ASYNCRL_SCORER_DEVICES`,
    given by `asyncrl rl`; unset, as the orchestrator was started: its own CUDA_VISIBLE_DEVICES)."""
    env = user_code_environment(environ)
    env["OMP_NUM_THREADS"] = str(getattr(config, "threads", 1))
    devices = environ.get(SCORER_DEVICES_ENV)
    if devices is not None and isinstance(config, RewardModelTermConfig) and config.on_cuda():
        env["CUDA_VISIBLE_DEVICES"] = devices
    return env
