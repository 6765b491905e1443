"""The orchestrator's side of an environment served by `asyncrl env-server` (`env[].address`).

`remote_environment` stands for the environment (its name, rubric weights, examples and, when
multi-turn, `max_turns`) and `RemotePool` for its workers: the same `score` and `respond` as
`RewardPool`, so the orchestrator runs local and remote environments alike. A server that does
not answer (or answers 5xx, or 503 when busy) is retried with backoff (0.5, 1, 2 s); then that
rollout scores 0 (a turn: its episode ends), counted as `remote_unavailable`, and the run goes
on. No more requests are in flight at once than the server says it admits (`capacity` in its
/info), so a busy server is waited for, not refused. A refusal (4xx: a changed key, a request
it will not take) costs the rollout the same way, counted as `remote_rejected`; an answer that
is not what the protocol says (not JSON, missing or mistyped fields) as `remote_malformed`. A
remote reward is held to the bounds of a local one: not finite, or beyond ±`MAX_ABS_REWARD`
(itself, a term or a step reward), and the rollout scores 0, counted as `out_of_range`. An
answer is read only up to a size (`ANSWER_LIMIT` for a reward or a turn, as a local worker's
answer line; `EXAMPLES_LIMIT` for the examples, `INFO_LIMIT` for /info): beyond it the read
stops, the rollout scores 0 (`remote_too_large`) or start-up fails, naming the server. The
first problem of each kind is logged, later ones only counted.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import asdict, replace
from typing import Any

import httpx

from asyncrl.config.base import ConfigError
from asyncrl.config.env import EnvConfig
from asyncrl.envs.base import Environment, Example, Messages, RewardFunction, Split
from asyncrl.envs.multi_turn import Reply, reply_problems
from asyncrl.envs.registry import VerifiersEnvironmentFound, load_environment
from asyncrl.envs.reward_pool import MAX_ABS_REWARD, EnvironmentFailed, RewardResult, within_bounds
from asyncrl.envs.tools import ToolCallRecord
from asyncrl.log import get_logger
from asyncrl.run_secret import server_key

logger = get_logger(__name__)

BACKOFF = (0.5, 1.0, 2.0)  # seconds before each retry
DEFAULT_CAPACITY = 16  # requests in flight to a server that does not say what it admits
# bytes of an answer read at most: a reward or a turn (a local worker's answer line holds as
# much), the examples (100,000 of them, a few KB each), what the server says it serves
ANSWER_LIMIT = 2**22
EXAMPLES_LIMIT = 2**29
INFO_LIMIT = 2**20


class AnswerTooLarge(Exception):
    """A server's answer ran past the size its route may have."""


def read_capped(chunks: Iterable[bytes], limit: int, where: str) -> bytes:
    """The body from `chunks`, or `AnswerTooLarge` naming `where` once it passes `limit` bytes
    (the rest is never read)."""
    body = bytearray()
    for chunk in chunks:
        body += chunk
        if len(body) > limit:
            raise AnswerTooLarge(f"{where} answered more than {limit} bytes; the rest was not read")
    return bytes(body)


async def aread_capped(chunks: AsyncIterator[bytes], limit: int, where: str) -> bytes:
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            raise AnswerTooLarge(f"{where} answered more than {limit} bytes; the rest was not read")
    return bytes(body)


def served_elsewhere(messages: Any, example: Example) -> float:
    raise RuntimeError("this environment's rubric runs on its env-server")


class RemoteEnvironment:
    """A single-turn environment on an env-server."""

    def __init__(self, address: str, headers: dict[str, str], info: dict[str, Any]) -> None:
        self.address = address.rstrip("/")
        self.headers = headers
        self.name: str = info["name"]
        self.capacity = int(info.get("capacity") or DEFAULT_CAPACITY)
        self.rubric = [
            RewardFunction(term["name"], served_elsewhere, float(term["weight"]))
            for term in info["rubric"]
        ]

    def examples(self, split: Split, count: int) -> list[Example]:
        where = f"env-server {self.address}/examples"
        with httpx.stream(
            "POST", f"{self.address}/examples", json={"split": split, "count": count},
            headers=self.headers, timeout=120,
        ) as response:  # fmt: skip
            response.raise_for_status()
            try:
                body = read_capped(response.iter_bytes(), EXAMPLES_LIMIT, where)
            except AnswerTooLarge as error:
                raise ConfigError(str(error)) from None
        return [self._example(index, fields) for index, fields in enumerate(json.loads(body))]

    def _example(self, index: int, fields: Any) -> Example:
        """An example of the server's answer, named by the server and its place there when it
        says no source of its own: the orchestrator checks its token ids at start-up
        (`orchestrator/example_checks.py`) and names it when a server refuses it."""
        where = f"env-server {self.address} example {index}"
        try:
            if isinstance(fields, dict) and "stop" in fields:  # JSON has no tuples
                fields = {**fields, "stop": tuple(fields["stop"] or ())}
            example = Example(**fields)
        except TypeError as error:
            raise ConfigError(f"{where}: not an example ({error})") from None
        return example if example.source else replace(example, source=where)


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
    where = f"env-server {address.rstrip('/')}/info"
    try:
        with httpx.stream("GET", f"{address.rstrip('/')}/info", headers=headers,
                          timeout=30) as response:  # fmt: skip
            response.raise_for_status()
            body = read_capped(response.iter_bytes(), INFO_LIMIT, where)
    except httpx.HTTPError as error:
        message = f"env address {address}: no environment server answers ({error})"
        raise ConfigError(message) from None
    except AnswerTooLarge as error:
        raise ConfigError(str(error)) from None
    info = json.loads(body)
    kind = RemoteMultiTurnEnvironment if info.get("multi_turn") else RemoteEnvironment
    return kind(address, headers, info)


class _Lost(Exception):
    """The server gave no usable answer; `kind` is the failure counter it adds to."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class RemotePool:
    def __init__(self, env: RemoteEnvironment, timeout: float) -> None:
        self.env = env
        self.rubric = env.rubric
        self.timeout = timeout
        self.failures: Counter[str] = Counter()
        self.http: httpx.AsyncClient | None = None
        self._logged: set[str] = set()
        self._in_flight: asyncio.Semaphore | None = None

    async def start(self) -> None:
        self.http = httpx.AsyncClient(headers=self.env.headers, timeout=self.timeout + 30)
        # never more requests at once than the server admits: the rest wait here, not refused
        self._in_flight = asyncio.Semaphore(self.env.capacity)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()

    async def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """The server's answer; `_Lost` (counted, the first of its kind logged) when it gives
        none, after the retries for what a retry may cure."""
        assert self.http is not None, "start() first"
        where = f"env-server {self.env.address}{route}"
        try:
            answer = await self._answer(route, body)
        except _Lost as lost:
            self.failures[lost.kind] += 1
            self._log_once(lost.kind, f"{where}: {lost}; the rollout scores 0")
            raise
        return answer

    async def _answer(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        assert self.http is not None and self._in_flight is not None
        where = f"env-server {self.env.address}{route}"
        for attempt, pause in enumerate([*BACKOFF, None]):
            try:
                async with (
                    self._in_flight,
                    self.http.stream("POST", f"{self.env.address}{route}", json=body) as response,
                ):
                    status = response.status_code
                    content = await aread_capped(response.aiter_bytes(), ANSWER_LIMIT, where)
                if status < 500:
                    return _json_object(status, content)
                problem = f"status {status}"
            except AnswerTooLarge as error:
                raise _Lost("remote_too_large", str(error).removeprefix(f"{where} ")) from None
            except httpx.TransportError as error:
                problem = str(error) or type(error).__name__
            if pause is None:
                raise _Lost("remote_unavailable", f"failed {attempt + 1} times ({problem})")
            await asyncio.sleep(pause)
        raise AssertionError("unreachable")

    def _log_once(self, kind: str, message: str) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            logger.warning(message)

    async def score(
        self, completion: str | Messages, example: Example, steps: bool = False
    ) -> RewardResult:
        key = "messages" if isinstance(completion, list) else "completion"
        body = {key: completion, "example": asdict(example), "steps": steps}
        zeros = {term.name: 0.0 for term in self.rubric}
        try:
            answer = await self._post("/score", body)
        except _Lost as lost:
            return RewardResult(0.0, zeros, lost=lost.kind)
        try:
            result = _reward_result(answer)
        except (KeyError, TypeError, ValueError) as error:
            self.failures["remote_malformed"] += 1
            self._log_once(
                "remote_malformed",
                f"env-server {self.env.address}/score answered something that is not a reward "
                f"({error!r:.300}); the rollout scores 0",
            )
            return RewardResult(0.0, zeros, lost="remote_malformed")
        numbers = [result.reward, *result.values.values(), *(r for _, r in result.steps)]
        if not all(within_bounds(number) for number in numbers):
            self.failures["out_of_range"] += 1
            self._log_once(
                "out_of_range",
                f"env-server {self.env.address} scored a rollout {result.reward} (or one of its "
                f"terms or steps out of range); rewards must be finite and within "
                f"±{MAX_ABS_REWARD:g}: the rollout scores 0",
            )
            finite = {k: v if within_bounds(v) else 0.0 for k, v in result.values.items()}
            return RewardResult(0.0, finite, [*result.failed, "out_of_range"])
        return result

    async def respond(self, messages: Messages, example: Example) -> Reply:
        try:
            answer = await self._post(
                "/respond", {"messages": messages, "example": asdict(example)}
            )
        except _Lost as lost:
            raise EnvironmentFailed(lost.kind, str(lost)) from None
        try:
            if "error" in answer:
                kind, message = str(answer["error"]["kind"]), str(answer["error"]["message"])
                self.failures[f"env_{kind}"] += 1
                raise EnvironmentFailed(kind, message)
            calls = [ToolCallRecord(str(tool), str(error)) for tool, error in answer["tool_calls"]]
            reply = Reply(list(answer["messages"]), bool(answer["done"]), calls)
            problem = reply_problems(reply)
        except (KeyError, TypeError, ValueError) as error:
            problem = repr(error)
        if problem is not None:
            self.failures["remote_malformed"] += 1
            self._log_once("remote_malformed", f"env-server {self.env.address}/respond answered "
                           f"something that is not a reply ({problem:.300})")  # fmt: skip
            raise EnvironmentFailed("remote_malformed", problem)
        return reply


def _json_object(status: int, content: bytes) -> dict[str, Any]:
    """A 2xx answer's JSON object; `_Lost` for a refusal (4xx) or anything but an object."""
    if status >= 400:
        try:
            said = json.loads(content)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            said = content.decode(errors="replace")
        raise _Lost("remote_rejected", f"refused with status {status}: {said:.300}")
    try:
        answer = json.loads(content)
    except ValueError as error:
        raise _Lost("remote_malformed", f"answered something that is not JSON ({error})") from None
    if not isinstance(answer, dict):
        raise _Lost("remote_malformed", f"answered a {type(answer).__name__}, not an object")
    return answer


def _reward_result(answer: dict[str, Any]) -> RewardResult:
    """A /score answer as a `RewardResult`, every field checked for its type."""
    values = answer["values"]
    if not isinstance(values, dict):
        raise TypeError(f"values is a {type(values).__name__}")
    steps = [(int(end), _number(reward)) for end, reward in answer.get("steps") or []]
    failed = answer.get("failed") or []
    lost = answer.get("lost")
    if not isinstance(failed, list) or not (lost is None or isinstance(lost, str)):
        raise TypeError("failed must be a list and lost a string or null")
    return RewardResult(
        _number(answer["reward"]), {str(k): _number(v) for k, v in values.items()},
        [str(name) for name in failed], lost, steps,
    )  # fmt: skip


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{value!r:.50} is not a number")
    return float(value)


def environment_of(spec: EnvConfig, model: str | None = None) -> Environment:
    """The environment a config entry names: served at `address`, a verifiers environment
    (its episodes played by its own workers, for `model`), or loaded here."""
    if spec.address is not None:
        return remote_environment(spec.address, server_key(spec.api_key_var))
    try:
        if spec.verifiers is not None:
            raise VerifiersEnvironmentFound(spec.id)
        return load_environment(spec.id, spec.args)
    except VerifiersEnvironmentFound:
        if model is None:
            raise
        from asyncrl.envs.verifiers.environment import VerifiersEnvironment

        return VerifiersEnvironment(spec, model)
