"""Score completions in worker processes with a hard timeout per rollout.

A reward that raises or returns NaN gives 0 for its term; one that hangs past `timeout` gets
its worker killed and replaced, and the rollout scores 0. Every failure is counted; the first
traceback of each reward function is logged, later ones only counted.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from asyncrl.envs.base import Example, RewardFunction, rubric_reward
from asyncrl.log import get_logger

logger = get_logger(__name__)


@dataclass
class RewardResult:
    reward: float
    values: dict[str, float]
    failed: list[str] = field(default_factory=list)  # rubric terms that raised / were not finite
    timed_out: bool = False
    steps: list[tuple[int, float]] = field(default_factory=list)  # (end character, reward)


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.stale = False  # killed mid-task: replace before the next use


class RewardPool:
    def __init__(
        self, env_id: str, env_args: dict[str, Any], rubric: list[RewardFunction],
        num_workers: int = 2, timeout: float = 30.0,
    ) -> None:  # fmt: skip
        self.spec = json.dumps({"id": env_id, "args": env_args})
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
        )  # fmt: skip
        worker = _Worker(process)
        self._workers.append(worker)
        return worker

    async def _replace(self, worker: _Worker) -> _Worker:
        if worker.process.returncode is None:
            worker.process.kill()
            await worker.process.wait()
        self._workers.remove(worker)
        return await self._spawn()

    async def score(self, completion: str, example: Example, steps: bool = False) -> RewardResult:
        worker = await self._idle.get()
        if worker.stale:
            worker = await self._replace(worker)
        try:
            task = json.dumps(
                {"completion": completion, "example": asdict(example), "steps": steps}
            )
            assert worker.process.stdin is not None and worker.process.stdout is not None
            worker.process.stdin.write(task.encode() + b"\n")
            await worker.process.stdin.drain()
            line = await asyncio.wait_for(worker.process.stdout.readline(), self.timeout)
            if not line:
                raise ConnectionError("reward worker exited")
        except (TimeoutError, ConnectionError, BrokenPipeError) as error:
            worker = await self._replace(worker)
            self.failures["timeout" if isinstance(error, TimeoutError) else "worker_died"] += 1
            self._log_once("timeout", f"reward scoring failed ({error or 'timed out'}) after "
                           f"{self.timeout} s; the rollout scores 0")  # fmt: skip
            zeros = {term.name: 0.0 for term in self.rubric}
            return RewardResult(0.0, zeros, timed_out=True)
        except asyncio.CancelledError:
            # its answer may still arrive and would be read as the next task's: never reuse it
            # (killed now, replaced by its next user: nothing is spawned while shutting down)
            worker.process.kill()
            worker.stale = True
            raise
        finally:
            await self._idle.put(worker)
        answer = json.loads(line)
        for name, trace in answer["errors"].items():
            self.failures[name] += 1
            self._log_once(name, f"reward function `{name}` failed (scored 0):\n{trace}")
        values = answer["values"]
        steps = [(int(end), float(reward)) for end, reward in answer.get("steps", [])]
        failed = [name for name in answer["errors"] if name != "step_rewards"]
        return RewardResult(rubric_reward(values, self.rubric), values, failed, steps=steps)

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            logger.warning(message)

    async def close(self) -> None:
        for worker in self._workers:
            if worker.process.returncode is None:
                worker.process.kill()
                await worker.process.wait()
        self._workers.clear()
