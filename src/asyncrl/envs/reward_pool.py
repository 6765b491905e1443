"""Score completions in worker processes with a hard timeout per rollout.

A reward that raises or returns NaN gives 0 for its term. A rollout scores 0 when its total is
not finite or beyond ±`MAX_ABS_REWARD`, when its reward hangs past `timeout`, or when its
worker dies (memory or CPU limit) or answers something undecodable; the worker is then killed
with everything it started (its own session) and replaced. Every failure is counted; the first
message of each kind is logged, later ones only counted. The same workers answer a multi-turn
environment's turns, under the same timeout and limits: a failed turn ends its episode, and
the turn's tool calls together get `TOOL_BUDGET` of its timeout, so slow tools end the turn's
tool calls, not the worker. A worker dies with the process that runs the pool (SIGKILL from the
kernel, PR_SET_PDEATHSIG), so a killed orchestrator leaves no worker running. A worker runs
reward code that may run model-written code: it starts without the run's secret and keys
(`user_code.py`: an allowlist of variables, and no capability that reads another
process).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from asyncrl.envs.base import Example, Messages, RewardFunction, rubric_reward
from asyncrl.envs.multi_turn import Reply
from asyncrl.envs.tools import ToolCallRecord
from asyncrl.log import get_logger
from asyncrl.processes import kill_session
from asyncrl.user_code import start_user_code, user_code_environment

logger = get_logger(__name__)

MAX_ABS_REWARD = 1e9  # far beyond any real reward, far below overflow when a batch is summed
ANSWER_LIMIT = 2**22  # bytes in one answer line (step rewards of a long completion fit)
KILL_GRACE = 2.0  # seconds to wait for a killed worker before abandoning its pipes
TOOL_BUDGET = 0.8  # share of a turn's timeout its tool calls may use: the turn ends, not the worker


@dataclass
class RewardResult:
    reward: float
    values: dict[str, float]
    failed: list[str] = field(default_factory=list)  # rubric terms that raised / were not finite
    lost: str | None = None  # why the worker gave no answer ("timeout", "worker_died"…)
    steps: list[tuple[int, float]] = field(default_factory=list)  # (end character, reward)


class WorkerFailed(Exception):
    """The worker could not answer: it died, hung, or sent something undecodable."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # the failure counter it adds to


class EnvironmentPool(Protocol):
    """Where an environment's code runs for the orchestrator: this machine's worker processes
    (`RewardPool`) or an env-server's (`remote.RemotePool`)."""

    rubric: list[RewardFunction]
    failures: Counter[str]

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def score(
        self, completion: str | Messages, example: Example, steps: bool = False
    ) -> RewardResult: ...

    async def respond(self, messages: Messages, example: Example) -> Reply: ...


class EnvironmentFailed(Exception):
    """A multi-turn environment gave no usable answer to a turn (raised, hung, died)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.stale = False  # killed mid-task: replace before the next use


class RewardPool:
    def __init__(
        self, env_id: str, env_args: dict[str, Any], rubric: list[RewardFunction],
        num_workers: int = 2, timeout: float = 30.0,
        memory_limit: float | None = None, cpu_limit: float | None = None,
    ) -> None:  # fmt: skip
        self.spec = json.dumps(
            {"id": env_id, "args": env_args, "memory_limit": memory_limit, "cpu_limit": cpu_limit}
        )
        self.rubric = rubric
        self.num_workers = num_workers
        self.timeout = timeout
        self.failures: Counter[str] = Counter()  # "<term>" or "timeout" -> count
        self._logged: set[str] = set()
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._workers: list[_Worker] = []

    async def start(self) -> None:
        for _ in range(self.num_workers):
            await self._idle.put(await self._spawn())

    async def _spawn(self) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "asyncrl.envs.reward_worker", self.spec,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            start_new_session=True, limit=ANSWER_LIMIT, preexec_fn=start_user_code,
            env=user_code_environment(),
        )  # fmt: skip
        worker = _Worker(process)
        self._workers.append(worker)
        return worker

    async def _replace(self, worker: _Worker) -> _Worker:
        await self._kill(worker)
        self._workers.remove(worker)
        return await self._spawn()

    @staticmethod
    async def _kill(worker: _Worker) -> None:
        """Kill the worker's whole process group; never wait on pipes a stray child holds."""
        await kill_session(worker.process, "reward worker", KILL_GRACE)

    async def _ask(self, worker: _Worker, task: bytes) -> dict[str, Any]:
        process = worker.process
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(task)
            await process.stdin.drain()
            line = await asyncio.wait_for(process.stdout.readline(), self.timeout)
        except TimeoutError:
            raise WorkerFailed(
                "timeout", f"reward scoring timed out after {self.timeout} s"
            ) from None
        except (ConnectionError, ValueError) as error:  # ValueError: a line over the limit
            raise WorkerFailed(
                "worker_protocol", f"reward worker broke the protocol: {error}"
            ) from error
        if not line:
            code = process.returncode if process.returncode is not None else await process.wait()
            raise WorkerFailed("worker_died", f"reward worker exited ({describe_exit(code)})")
        try:
            answer = json.loads(line)
            if not isinstance(answer, dict):
                raise ValueError(f"not an answer: {line[:200]!r}")
        except ValueError as error:  # JSONDecodeError is a ValueError
            raise WorkerFailed(
                "worker_protocol", f"reward worker broke the protocol: {error}"
            ) from error
        return answer

    async def score(
        self, completion: str | Messages, example: Example, steps: bool = False
    ) -> RewardResult:
        """The rubric reward of a completion, or of a multi-turn episode's messages."""
        key = "messages" if isinstance(completion, list) else "completion"
        task = {key: completion, "example": asdict(example), "steps": steps}
        try:
            answer = await self._run(task)
        except WorkerFailed as failure:
            self._log_once(failure.kind, f"{failure}; the rollout scores 0")
            zeros = {term.name: 0.0 for term in self.rubric}
            return RewardResult(0.0, zeros, lost=failure.kind)
        if not isinstance(answer.get("values"), dict):
            self.failures["worker_protocol"] += 1
            return RewardResult(
                0.0, {term.name: 0.0 for term in self.rubric}, lost="worker_protocol"
            )
        return self._result(answer)

    async def respond(self, messages: Messages, example: Example) -> Reply:
        """A multi-turn environment's answer to the last model turn, within `timeout`.
        Raises `EnvironmentFailed` (counted as `env_<kind>`) when it raised, hung, died or
        answered something that is not a reply: that episode ends, the run goes on."""
        task = {"kind": "respond", "messages": messages, "example": asdict(example),
                "tool_budget": TOOL_BUDGET * self.timeout}  # fmt: skip
        try:
            answer = await self._run(task, prefix="env_")
        except WorkerFailed as failure:
            raise EnvironmentFailed(failure.kind, str(failure)) from None
        if "error" in answer:
            self.failures["env_error"] += 1
            trace = answer.get("traceback") or answer["error"]
            self._log_once("env_error", f"an environment failed to answer a turn:\n{trace}")
            raise EnvironmentFailed("error", str(answer["error"])[-2000:])
        calls = [ToolCallRecord(str(tool), str(error)) for tool, error in answer["tool_calls"]]
        return Reply(list(answer["messages"]), bool(answer["done"]), calls)

    async def _run(self, task: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        """One task on an idle worker; a worker that fails it is replaced and the failure
        counted (as `<prefix><kind>`) before `WorkerFailed` is raised."""
        worker = await self._idle.get()
        if worker.stale:
            worker = await self._replace(worker)
        try:
            return await self._ask(worker, json.dumps(task).encode() + b"\n")
        except WorkerFailed as failure:
            worker = await self._replace(worker)
            self.failures[prefix + failure.kind] += 1
            raise
        except asyncio.CancelledError:
            # its answer may still arrive and would be read as the next task's: never reuse it
            # (killed now, replaced by its next user: nothing is spawned while shutting down)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.process.pid, signal.SIGKILL)
            worker.stale = True
            raise
        finally:
            await self._idle.put(worker)

    def _result(self, answer: dict[str, Any]) -> RewardResult:
        errors: dict[str, str] = answer.get("errors") or {}
        for name, trace in errors.items():
            self.failures[name] += 1
            self._log_once(name, f"reward function `{name}` failed (scored 0):\n{trace}")
        values: dict[str, float] = answer["values"]
        failed = [name for name in errors if name != "step_rewards"]
        steps = [(int(end), float(reward)) for end, reward in answer.get("steps", [])]
        total = rubric_reward(values, self.rubric)
        if not within_bounds(total) or not all(within_bounds(r) for _, r in steps):
            self.failures["out_of_range"] += 1
            self._log_once(
                "out_of_range",
                f"a rollout's reward is {total} (or one of its step rewards is out of range); "
                f"rewards must be finite and within ±{MAX_ABS_REWARD:g}: the rollout scores 0",
            )
            return RewardResult(0.0, values, [*failed, "out_of_range"])
        return RewardResult(total, values, failed, steps=steps)

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            logger.warning(message)

    async def close(self) -> None:
        for worker in self._workers:
            await self._kill(worker)
        self._workers.clear()


def within_bounds(reward: float) -> bool:
    return math.isfinite(reward) and abs(reward) <= MAX_ABS_REWARD


def describe_exit(code: int) -> str:
    if code >= 0:
        return f"status {code}"
    name = signal.Signals(-code).name
    hint = {"SIGXCPU": ": its CPU limit", "SIGKILL": ": killed, maybe for memory"}.get(name, "")
    return f"{name}{hint}"
