"""The worker processes that play a verifiers environment's episodes, and what each one cost.

`run_episode` hands an episode to the least busy worker (`episodes_per_worker` at once each)
and waits for its record, for at most `episode_timeout`. Bad input costs that episode, never
the run; each way it fails is counted by reason (`failures`, reported as
`orchestrator/verifiers/<env>/failed/<reason>`) and logged once, later ones only counted:

- `timeout`: the episode ran past its deadline (an environment or a tool that hangs or loops
  while the event loop runs); the worker cancels it, which stops its tool servers;
- `worker_hung`: the worker sent no heartbeat for `hang_seconds` (code that blocks its event
  loop: a synchronous reward or tool that never returns); `worker_died`: it exited (a crash, its
  memory limit); `worker_protocol`: it wrote something that is not a message (a line over
  `LINE_LIMIT`: an episode too large to report). The worker is then killed with every process
  it started (`process_tree.py`) and replaced; all its episodes in flight fail so;
- `error`: the environment raised past verifiers' own boundaries;
- the error types verifiers recorded on a failed episode or trace (`EnvError`, `ToolsetError`,
  `HarnessError`, `ProviderError`...), which `verifiers_group.py` counts here too, beside
  `token_mismatch` and `malformed_record`.

A worker's stderr (the environment's prints, verifiers' logs) reaches the orchestrator's log up
to `OUTPUT_BUDGET` bytes per worker; past that it is read and dropped, so an environment that
floods its output slows nothing and fills no disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from asyncrl.config.base import ConfigError
from asyncrl.envs.base import Example, Messages
from asyncrl.envs.multi_turn import Reply
from asyncrl.envs.reward_pool import RewardResult, describe_exit
from asyncrl.envs.verifiers import process_tree, record
from asyncrl.envs.verifiers.environment import VerifiersEnvironment, worker_spec
from asyncrl.log import get_logger
from asyncrl.user_code import start_user_code, user_code_environment

logger = get_logger(__name__)

LINE_LIMIT = 2**25  # bytes in one message from a worker (an episode's record)
OUTPUT_BUDGET = 1 << 20  # bytes of a worker's stderr passed on to the log
START_TIMEOUT_S = 900.0
WATCH_S = 1.0


class Gate(Protocol):
    """What the pool needs of the orchestrator's token gate (`orchestrator/token_gate.py`)."""

    url: str
    key: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def open_episode(self, temperature: float, seed: int | None, sampling: Any) -> str: ...

    async def bind(self, session: str, episode: str) -> None: ...

    def close_episode(self, episode: str) -> list[Any]: ...


@dataclass
class Played:
    """An episode's outcome: its record and the gate's turns, or why it has none."""

    record: record.EpisodeRecord | None
    turns: list[Any]
    failure: str | None = None
    seconds: float = 0.0


@dataclass
class _Worker:
    process: asyncio.subprocess.Process
    ready: asyncio.Future[None]
    runs: dict[str, asyncio.Future[Played]] = field(default_factory=dict)
    last_beat: float = field(default_factory=time.monotonic)
    tree: list[process_tree.Process] = field(default_factory=list)
    readers: list[asyncio.Task[None]] = field(default_factory=list)
    dead: bool = False


class VerifiersPool:
    def __init__(
        self,
        environment: VerifiersEnvironment,
        gate: Gate,
        served_name: str,
    ) -> None:
        self.environment = environment
        self.settings = environment.settings
        self.gate = gate
        self.spec = worker_spec(environment.spec, environment.model) | {"served_name": served_name}
        self.failures: Counter[str] = Counter()
        self._stats: dict[str, list[float]] = defaultdict(list)
        self._counts: Counter[str] = Counter()
        self._logged: set[str] = set()
        self._workers: list[_Worker] = []
        self._slots = asyncio.Semaphore(self.settings.workers * self.settings.episodes_per_worker)
        self._watch: asyncio.Task[None] | None = None
        self._spawning = asyncio.Lock()
        self._closing = False

    @property
    def rubric(self) -> Any:
        return self.environment.rubric

    # lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        await self.gate.start()
        self.spec["gate_url"] = self.gate.url
        for _ in range(self.settings.workers):
            worker = await self._spawn()
            try:
                await asyncio.wait_for(asyncio.shield(worker.ready), START_TIMEOUT_S)
            except TimeoutError:
                raise ConfigError(
                    f"env `{self.environment.name}`: a verifiers worker did not "
                    f"start in {START_TIMEOUT_S:.0f} s"
                ) from None
        self._watch = asyncio.create_task(self._watchdog())

    async def close(self) -> None:
        self._closing = True
        if self._watch is not None:
            self._watch.cancel()
        for worker in list(self._workers):
            await self._kill(worker, None)
        await self.gate.close()

    async def _spawn(self) -> _Worker:
        python_bin = os.path.dirname(sys.executable)
        env = user_code_environment() | {record.GATE_KEY_VAR: self.gate.key}
        env["PATH"] = python_bin + os.pathsep + env.get("PATH", "")  # uv beside the interpreter
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "asyncrl.envs.verifiers.worker",
            "serve",
            json.dumps(self.spec),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            limit=LINE_LIMIT,
            preexec_fn=start_user_code,
            env=env,
        )
        worker = _Worker(process, asyncio.get_running_loop().create_future())
        worker.readers = [
            asyncio.create_task(self._read(worker)),
            asyncio.create_task(self._pass_output(worker)),
        ]
        self._workers.append(worker)
        return worker

    async def _kill(self, worker: _Worker, reason: str | None, message: str = "") -> None:
        """Kill `worker` and everything it started; its episodes in flight fail with `reason`."""
        if worker.dead:
            return
        worker.dead = True
        tree = process_tree.descendants(worker.process.pid) + worker.tree
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.process.pid, signal.SIGKILL)
        process_tree.kill(tree)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(worker.process.wait(), 5)
        if worker in self._workers:
            self._workers.remove(worker)
        for task in worker.readers:
            if task is not asyncio.current_task():
                task.cancel()
        if not worker.ready.done():
            worker.ready.set_exception(
                ConfigError(
                    f"env `{self.environment.name}`: a verifiers worker failed to start: {message}"
                )
            )
        for future in worker.runs.values():
            if not future.done() and reason is not None:
                self.fail(reason, message)
                future.set_result(Played(None, [], reason))
        worker.runs.clear()

    # the worker's messages -----------------------------------------------------------------
    async def _read(self, worker: _Worker) -> None:
        decoder = msgspec.json.Decoder(record.FromWorker)
        stdout = worker.process.stdout
        assert stdout is not None
        while True:
            try:
                line = await stdout.readline()
            except (ValueError, ConnectionError) as error:  # ValueError: a line over the limit
                await self._kill(
                    worker, "worker_protocol", f"the worker broke the protocol: {error}"
                )
                return
            if not line:
                code = await worker.process.wait()
                await self._kill(
                    worker, "worker_died", f"the worker exited ({describe_exit(code)})"
                )
                return
            try:
                message = decoder.decode(line)
            except msgspec.DecodeError as error:
                await self._kill(
                    worker,
                    "worker_protocol",
                    f"the worker wrote something that is not a message ({error}): {line[:200]!r}",
                )
                return
            worker.last_beat = time.monotonic()
            await self._receive(worker, message)

    async def _receive(self, worker: _Worker, message: Any) -> None:
        if isinstance(message, record.Ready):
            if not worker.ready.done():
                worker.ready.set_result(None)
        elif isinstance(message, record.Refused):
            await self._kill(worker, None, message.reason)
        elif isinstance(message, record.Started):
            if message.run in worker.runs:
                await self.gate.bind(message.trace, message.run)
        elif isinstance(message, record.Done | record.Failed):
            future = worker.runs.pop(message.run, None)
            if future is None or future.done():
                return
            if isinstance(message, record.Failed):
                self.fail(message.reason, message.message)
                future.set_result(Played(None, [], message.reason))
            else:
                future.set_result(Played(message.episode, []))

    async def _pass_output(self, worker: _Worker) -> None:
        stderr = worker.process.stderr
        assert stderr is not None
        passed = 0
        while chunk := await stderr.read(65536):
            if passed < OUTPUT_BUDGET:
                sys.stderr.write(chunk[: OUTPUT_BUDGET - passed].decode(errors="replace"))
                passed += len(chunk)
                if passed >= OUTPUT_BUDGET:
                    self.fail(
                        "output_flood",
                        f"a worker wrote over {OUTPUT_BUDGET} bytes of "
                        "output: the rest of its output is dropped",
                    )

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            now = time.monotonic()
            for worker in list(self._workers):
                if not worker.ready.done() or worker.dead:
                    continue
                if now - worker.last_beat > self.settings.hang_seconds:
                    await self._kill(
                        worker,
                        "worker_hung",
                        f"a worker sent nothing for "
                        f"{self.settings.hang_seconds:g} s: code blocking its event "
                        "loop (a synchronous reward or tool that hangs or loops); "
                        "it is killed and replaced",
                    )
                elif worker.runs:
                    worker.tree = process_tree.descendants(worker.process.pid)

    async def _worker(self) -> _Worker:
        """The least busy live worker, spawning replacements for the dead."""
        async with self._spawning:
            while len(self._workers) < self.settings.workers and not self._closing:
                worker = await self._spawn()
                await asyncio.shield(worker.ready)
        return min(self._workers, key=lambda w: len(w.runs))

    # episodes ------------------------------------------------------------------------------
    async def run_episode(
        self, example: Example, temperature: float, seed: int | None, sampling: Any
    ) -> Played:
        """One episode of `example` at `temperature` with the run's `sampling` (training's or
        an evaluation's `orchestrator.SamplingConfig`)."""
        started = time.monotonic()
        async with self._slots:
            try:
                worker = await self._worker()
            except ConfigError as error:
                self.fail("worker_died", str(error))
                return Played(None, [], "worker_died", time.monotonic() - started)
            episode = self.gate.open_episode(temperature, seed, sampling)
            future: asyncio.Future[Played] = asyncio.get_running_loop().create_future()
            worker.runs[episode] = future
            run = record.Run(episode, str(example.info["vf_key"]), temperature)
            try:
                self._send(worker, run)
                played = await asyncio.wait_for(
                    asyncio.shield(future), self.settings.episode_timeout
                )
            except TimeoutError:
                worker.runs.pop(episode, None)
                with contextlib.suppress(Exception):
                    self._send(worker, record.Cancel(episode))
                self.fail(
                    "timeout",
                    f"an episode ran past {self.settings.episode_timeout:g} s "
                    "(`verifiers.episode_timeout`): cancelled, it scores 0",
                )
                played = Played(None, [], "timeout")
            finally:
                turns = self.gate.close_episode(episode)
        played.turns = turns
        played.seconds = time.monotonic() - started
        if played.record is not None:
            self._observe(played.record)
        return played

    def _send(self, worker: _Worker, message: Any) -> None:
        stdin = worker.process.stdin
        assert stdin is not None
        stdin.write(msgspec.json.encode(message) + b"\n")

    def _observe(self, episode: record.EpisodeRecord) -> None:
        """Stop conditions, errors, metrics and time shares, for `metrics`."""
        for kind in episode.errors:
            self.fail(kind, episode.error)
        for trace in episode.traces:
            self._counts[f"stop/{trace.stop or 'none'}"] += 1
            for kind in trace.errors:
                self.fail(kind, trace.error)
            for name, value in trace.metrics.items():
                if value is not None:
                    self._stats[f"metric/{name}"].append(float(value))
            for part, seconds in trace.seconds.items():
                self._stats[f"seconds/{part}"].append(seconds)

    def fail(self, reason: str, message: str) -> None:
        """Count a failure by reason; log the first of each reason."""
        self.failures[reason] += 1
        self._counts[f"failed/{reason}"] += 1
        if reason not in self._logged:
            self._logged.add(reason)
            logger.warning(
                "env `%s`: an episode failed (%s; it scores 0, later ones are only counted): %s",
                self.environment.name,
                reason,
                message,
            )

    def metrics(self) -> dict[str, float]:
        """Since the last call: failures by reason, stop conditions, the environment's own
        metrics (means) and the seconds per part of an episode (means)."""
        prefix = f"orchestrator/verifiers/{self.environment.name}"
        taken = {f"{prefix}/{key}": float(count) for key, count in self._counts.items()}
        taken |= {f"{prefix}/{key}": statistics.fmean(v) for key, v in self._stats.items()}
        self._counts.clear()
        self._stats.clear()
        return taken

    # the rest of `EnvironmentPool`: a verifiers environment plays and scores its episodes ---
    async def score(
        self, completion: str | Messages, example: Example, steps: bool = False
    ) -> RewardResult:
        raise RuntimeError("a verifiers environment scores its own episodes")

    async def respond(self, messages: Messages, example: Example) -> Reply:
        raise RuntimeError("a verifiers environment plays its own turns")
