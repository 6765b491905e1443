"""A generative judge: an LLM behind an OpenAI-compatible chat endpoint (`asyncrl infer`, vLLM, a
hosted API) grades each rollout, read back as a number from its text or as the probability of a
verdict token from its logprobs.

Requests are bounded (`max_concurrent` in flight) and each attempt has `timeout` seconds. An
attempt that times out or finds no server (a refused connection, 5xx, 429) is retried after
`backoff`, doubled each time, `retries` times; a 4xx or a body that is not a chat completion is
an `error` and not retried (the same request would meet it again); an answer with no score is
`unparseable`. Any of them costs the rollout, never the run. The HTTP calls are the only work
done on the orchestrator's event loop: the judge's model runs in its server.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

from asyncrl.config.base import ConfigError
from asyncrl.config.model_rewards import JudgeTermConfig
from asyncrl.envs.model_rewards.items import ScoreItem
from asyncrl.envs.model_rewards.judge_answers import (
    first_token_alternatives,
    number_score,
    verdict_score,
)
from asyncrl.envs.model_rewards.stats import Judged, TermStats
from asyncrl.log import get_logger
from asyncrl.run_secret import key_of, server_key
from asyncrl.waiting import Wait

logger = get_logger(__name__)


class Attempt(Exception):
    """One attempt failed; `kind` is the failure it counts as, `retry` whether to try again."""

    def __init__(self, kind: str, message: str, retry: bool) -> None:
        super().__init__(message)
        self.kind, self.retry = kind, retry


class JudgeTerm:
    def __init__(self, config: JudgeTermConfig) -> None:
        assert config.base_url is not None  # the config refuses a judge without an endpoint
        self.config = config
        self.name = config.name
        self.weight = config.weight
        self.url = config.base_url.rstrip("/")
        self.model = config.model
        self.pattern = re.compile(config.number_pattern)
        self.stats = TermStats()
        self.limit = asyncio.Semaphore(config.max_concurrent)
        self.http: httpx.AsyncClient | None = None
        self._logged: set[str] = set()

    def headers(self) -> dict[str, str]:
        """The bearer key of `api_key_var` (`run_secret.server_key`: its value, else the key the
        run's secret gives it); none when it names none, or neither is set (an endpoint that
        wants one then refuses the start-up probe, naming the variable)."""
        variable = self.config.api_key_var
        key = server_key(variable) if variable else None
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def start(self) -> None:
        """Open the client and wait until the endpoint lists its models (a judge server started
        beside this role may still be loading); with no `model` named, take the first listed.
        An endpoint that refuses us (a wrong key or URL), or never answers within
        `startup_timeout`, is a configuration error: nothing could be judged."""
        self.http = httpx.AsyncClient(
            headers=self.headers(), timeout=httpx.Timeout(self.config.timeout)
        )
        try:
            listed = await self._models()
        except BaseException:
            await self.http.aclose()
            raise
        if self.model is None:
            if not listed:
                raise ConfigError(f"judge `{self.name}`: {self.url}/models lists no model")
            self.model = listed[0]
        logger.info("judge `%s`: %s at %s", self.name, self.model, self.url)

    async def _models(self) -> list[str]:
        assert self.http is not None
        wait = Wait(f"judge `{self.name}` at {self.url}", logger, self.config.startup_timeout)
        while True:
            try:
                response = await self.http.get(f"{self.url}/models", timeout=10.0)
                if response.status_code < 500:
                    break
            except httpx.TransportError:
                pass
            try:
                wait.check()
            except TimeoutError as error:
                raise ConfigError(f"judge `{self.name}`: {error}") from None
            await asyncio.sleep(0.5)
        if response.status_code >= 400:
            variable = self.config.api_key_var
            key = (
                f"${variable} is {'set' if key_of(variable) else 'unset'}"
                if variable
                else "no `api_key_var`"
            )
            raise ConfigError(
                f"judge `{self.name}`: {self.url}/models answered {response.status_code} "
                f"({response.text[:200]}); check `base_url` and the key ({key})"
            )
        try:
            return [str(model["id"]) for model in response.json()["data"]]
        except (ValueError, KeyError, TypeError) as error:
            raise ConfigError(
                f"judge `{self.name}`: {self.url}/models is not an OpenAI model list ({error!r})"
            ) from None

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()

    def body(self, item: ScoreItem) -> dict[str, Any]:
        config = self.config
        text = config.prompt.format(
            task=item.task_text, completion=item.completion_text, answer=item.answer
        )
        messages = [{"role": "user", "content": text}]
        if config.system_prompt:
            messages.insert(0, {"role": "system", "content": config.system_prompt})
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": config.answer_tokens(),
            "temperature": config.temperature,
        }
        if config.read == "verdict":
            body.update(logprobs=True, top_logprobs=config.top_logprobs)
        return body

    async def score(self, item: ScoreItem) -> Judged:
        """This rollout's value in [0, 1], or the failure that costs it."""
        async with self.limit:
            judged = await self._ask(self.body(item))
        self.stats.record(judged)
        return judged

    async def _ask(self, body: dict[str, Any]) -> Judged:
        pauses = [self.config.backoff * 2**n for n in range(self.config.retries)]
        for attempt, pause in enumerate([*pauses, None]):
            try:
                return self._read(await self._post(body))
            except Attempt as failure:
                if not failure.retry or pause is None:
                    tries = f" (after {attempt + 1} attempts)" if attempt else ""
                    self._log_once(failure.kind, f"{failure}{tries}")
                    return Judged.failed(failure.kind)
            self.stats.figures.retries += 1
            await asyncio.sleep(pause)
        raise AssertionError("unreachable: the last attempt returns")

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self.http is not None, "start() first"
        started = self.stats.request_started()
        try:
            response = await asyncio.wait_for(
                self.http.post(f"{self.url}/chat/completions", json=body), self.config.timeout
            )
        except (TimeoutError, httpx.TimeoutException):
            message = f"no answer in {self.config.timeout} s"
            raise Attempt("timeout", message, retry=True) from None
        except httpx.TransportError as error:
            message = f"cannot reach {self.url} ({str(error) or type(error).__name__})"
            raise Attempt("unavailable", message, retry=True) from None
        finally:
            self.stats.request_ended(started)
        if response.status_code == 429 or response.status_code >= 500:
            message = f"{self.url} answered {response.status_code}: {response.text[:200]}"
            raise Attempt("unavailable", message, retry=True)
        if response.status_code >= 400:
            message = (
                f"{self.url} refused the request ({response.status_code}): {response.text[:300]}"
            )
            raise Attempt("error", message, retry=False)
        try:
            answer = response.json()
            choice = answer["choices"][0]
            text = choice["message"]["content"] or ""
            if not isinstance(text, str):
                raise TypeError(f"content is {type(text).__name__}")
        except (ValueError, KeyError, IndexError, TypeError) as error:
            message = f"{self.url} answered something that is not a chat completion ({error!r})"
            raise Attempt("error", message, retry=False) from None
        usage = answer.get("usage") or {}
        self.stats.figures.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.stats.figures.completion_tokens += int(usage.get("completion_tokens") or 0)
        return choice

    def _read(self, choice: dict[str, Any]) -> Judged:
        config = self.config
        text = choice["message"]["content"] or ""
        if config.read == "number":
            value = number_score(text, self.pattern, config.scale)
            what = f"no number within {list(config.scale)} in the answer {text[:200]!r}"
        else:
            try:
                alternatives = first_token_alternatives(choice)
            except (KeyError, TypeError, ValueError) as error:
                raise Attempt("error", f"logprobs not as asked ({error!r})", retry=False) from None
            value = verdict_score(alternatives, config.verdicts)
            shown = [token for token, _ in alternatives[:8]]
            what = f"none of the verdicts {sorted(config.verdicts)} among the top tokens {shown}"
        if value is None:
            self._log_once("unparseable", f"the answer holds no score: {what}")
            return Judged.failed("unparseable")
        return Judged(value)

    def _log_once(self, kind: str, message: str) -> None:
        """The first failure of each kind is logged; later ones are only counted."""
        if kind not in self._logged:
            self._logged.add(kind)
            logger.warning("judge `%s`: %s; the rollout scores 0", self.name, message)
