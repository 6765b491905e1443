"""The orchestrator's side of an environment served by `asyncrl env-server` (`env[].address`).

`remote_environment` stands for the environment (its name, rubric weights, examples and, when
multi-turn, `max_turns`) and `RemotePool` for its workers: the same `score` and `respond` as
`RewardPool`, so the orchestrator runs local and remote environments alike. A server that does
not answer is retried with backoff (0.5, 1, 2 s); then that rollout scores 0 (a turn: its
episode ends), counted as `remote_unavailable`, and the run goes on.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from dataclasses import asdict
from typing import Any

import httpx

from asyncrl.config.base import ConfigError
from asyncrl.config.env import EnvConfig
from asyncrl.envs.base import Environment, Example, Messages, RewardFunction, Split
from asyncrl.envs.multi_turn import Reply
from asyncrl.envs.registry import load_environment
from asyncrl.envs.reward_pool import EnvironmentFailed, RewardResult
from asyncrl.envs.tools import ToolCallRecord
from asyncrl.log import get_logger

logger = get_logger(__name__)

BACKOFF = (0.5, 1.0, 2.0)  # seconds before each retry


def served_elsewhere(messages: Any, example: Example) -> float:
    raise RuntimeError("this environment's rubric runs on its env-server")


class RemoteEnvironment:
    """A single-turn environment on an env-server."""

    def __init__(self, address: str, headers: dict[str, str], info: dict[str, Any]) -> None:
        self.address = address.rstrip("/")
        self.headers = headers
        self.name: str = info["name"]
        self.rubric = [
            RewardFunction(term["name"], served_elsewhere, float(term["weight"]))
            for term in info["rubric"]
        ]

    def examples(self, split: Split, count: int) -> list[Example]:
        response = httpx.post(
            f"{self.address}/examples", json={"split": split, "count": count},
            headers=self.headers, timeout=120,
        )  # fmt: skip
        response.raise_for_status()
        return [Example(**fields) for fields in response.json()]


class RemoteMultiTurnEnvironment(RemoteEnvironment):
    """A multi-turn environment on an env-server (its turns are answered there, by `RemotePool`)."""

    def __init__(self, address: str, headers: dict[str, str], info: dict[str, Any]) -> None:
        super().__init__(address, headers, info)
        self.max_turns = int(info["max_turns"])

    def respond(self, messages: Messages, example: Example) -> Reply:
        raise RuntimeError("this environment's turns are answered by its env-server")


def remote_environment(address: str, api_key: str | None) -> RemoteEnvironment:
    """Ask the server what it serves; a server that cannot be reached is a config error."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{address.rstrip('/')}/info", headers=headers, timeout=30)
        response.raise_for_status()
    except httpx.HTTPError as error:
        message = f"env address {address}: no environment server answers ({error})"
        raise ConfigError(message) from None
    info = response.json()
    kind = RemoteMultiTurnEnvironment if info.get("multi_turn") else RemoteEnvironment
    return kind(address, headers, info)


class RemotePool:
    def __init__(self, env: RemoteEnvironment, timeout: float) -> None:
        self.env = env
        self.rubric = env.rubric
        self.timeout = timeout
        self.failures: Counter[str] = Counter()
        self.http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self.http = httpx.AsyncClient(headers=self.env.headers, timeout=self.timeout + 30)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()

    async def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The server's answer, or None once the retries are spent."""
        assert self.http is not None, "start() first"
        for attempt, pause in enumerate([*BACKOFF, None]):
            try:
                response = await self.http.post(f"{self.env.address}{route}", json=body)
                if response.status_code < 500:
                    response.raise_for_status()
                    answer: dict[str, Any] = response.json()
                    return answer
                problem = f"status {response.status_code}"
            except httpx.TransportError as error:
                problem = str(error) or type(error).__name__
            if pause is None:
                self.failures["remote_unavailable"] += 1
                logger.warning(
                    "env-server %s%s failed %d times (%s)", self.env.address, route,
                    attempt + 1, problem,
                )  # fmt: skip
                return None
            await asyncio.sleep(pause)
        return None

    async def score(
        self, completion: str | Messages, example: Example, steps: bool = False
    ) -> RewardResult:
        key = "messages" if isinstance(completion, list) else "completion"
        body = {key: completion, "example": asdict(example), "steps": steps}
        answer = await self._post("/score", body)
        if answer is None:
            zeros = {term.name: 0.0 for term in self.rubric}
            return RewardResult(0.0, zeros, lost="remote_unavailable")
        steps_list = [(int(end), float(reward)) for end, reward in answer.get("steps", [])]
        return RewardResult(
            float(answer["reward"]), dict(answer["values"]), list(answer.get("failed", [])),
            answer.get("lost"), steps_list,
        )  # fmt: skip

    async def respond(self, messages: Messages, example: Example) -> Reply:
        answer = await self._post("/respond", {"messages": messages, "example": asdict(example)})
        if answer is None:
            message = "the environment server does not answer"
            raise EnvironmentFailed("remote_unavailable", message)
        if "error" in answer:
            self.failures[f"env_{answer['error']['kind']}"] += 1
            raise EnvironmentFailed(answer["error"]["kind"], answer["error"]["message"])
        calls = [ToolCallRecord(str(tool), str(error)) for tool, error in answer["tool_calls"]]
        return Reply(list(answer["messages"]), bool(answer["done"]), calls)


def environment_of(spec: EnvConfig) -> Environment:
    """The environment a config entry names: served at `address`, or loaded here."""
    if spec.address is not None:
        return remote_environment(spec.address, os.environ.get(spec.api_key_var) or None)
    return load_environment(spec.id, spec.args)
