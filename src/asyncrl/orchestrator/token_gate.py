"""The token gate: verifiers environments generate through it, and it records what was sampled.

A verifiers environment plays its own episodes, and its train client asks for each policy turn
by token ids (`POST /inference/v1/generate`, vLLM's token-in/token-out route, in the shape
`renderers` 0.1.12 parses). The gate serves that route on 127.0.0.1, in the orchestrator's
event loop, and asks the run's inference servers through the one generate path every rollout
takes (`generation.generate`: the token-id completions route, failover, abort retries), so the
embedded engine, vLLM and SGLang all serve it alike. For every turn it records the prompt ids,
the sampled ids, their logprobs and the policy version of each token, under the episode the
turn belongs to: the trainer trains those records, never the environment's copy of them
(`verifiers_group.py` checks that each sampled span of a branch is one of them).

- Authentication: a key made fresh for the run, not derived from the run's secret; only the
  verifiers workers hold it (`$ASYNCRL_GATE_API_KEY`). Without it, 401.
- Attribution: the train client sends `X-Session-ID: <trace id>` on every turn; the worker
  names each trace's episode as the trace begins (`bind`). A turn of no known episode is 400.
- Sampling is the run's: the episode's temperature (`temperature` must equal it), the run's
  `top_p`/`top_k`/`min_tokens`/`repetition_penalty`. A key the run does not implement
  (`reasoning_effort`, a penalty) is 400 naming it; multimodal requests are 400. `max_tokens` is
  cut to what is left of `seq_len`; a prompt that leaves no room is 400 with renderers' own
  words for it ("exceeds maximum context length"), which asyncrl's harness reads as the
  episode's end. Every refusal is counted by reason and the first of each logged.
- `GET /v1/models` lists the model with `max_model_len` (renderers checks prompts against it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import secrets
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from asyncrl.config.orchestrator import OrchestratorConfig, SamplingConfig
from asyncrl.log import get_logger
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.generation import (
    GroupAborted,
    InferenceUnavailable,
    RequestRejected,
    Server,
    ServerError,
    generate,
)
from asyncrl.web.api_key import ApiKeyGuard
from asyncrl.web.body_limit import BodySizeLimit

logger = get_logger(__name__)

SESSION_HEADER = "x-session-id"
BIND_WAIT_S = 10.0  # a turn may arrive before the pool has read the line that names its episode
MAX_BODY = 64 << 20  # bytes: a prompt of a million token ids fits
TOP_LEVEL = {"model", "token_ids", "sampling_params", "cache_salt", "priority", "request_id"}
SAMPLING = {
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "stop_token_ids",
    "logprobs",
    "skip_special_tokens",
    "min_tokens",
    "repetition_penalty",
    "seed",
    "n",
    # verifiers' train client sets it on a multi-turn turn it bridges onto the last: where the
    # turn's new prompt starts, for replaying a mixture of experts' routing. asyncrl replays no
    # routing, so it is taken and unused (the token ids and logprobs are exact without it)
    "routed_experts_prompt_start",
}


@dataclass
class Turn:
    """One policy turn as the gate served it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str


@dataclass
class EpisodeTurns:
    temperature: float
    seed: int | None
    sampling: SamplingConfig  # the run's (training's, or an evaluation's)
    turns: list[Turn] = field(default_factory=list)
    server: Server | None = None  # its turns go where its prefix is cached
    requests: int = 0


class Refused(Exception):
    def __init__(self, reason: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.reason, self.status = reason, status


class TokenGate:
    def __init__(
        self, clients: ClientPool, config: OrchestratorConfig, model_name: Callable[[], str]
    ) -> None:
        self.clients = clients
        self.config = config
        self.model_name = model_name  # the base model, or the LoRA adapter once loaded
        self.key = secrets.token_urlsafe(32)
        self.url = ""
        self.refusals: Counter[str] = Counter()
        self.episodes: dict[str, EpisodeTurns] = {}
        self.sessions: dict[str, str] = {}  # trace id -> episode id
        self._bound = asyncio.Condition()
        self._logged: set[str] = set()
        self._users = 0
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None

    # lifecycle: shared by every verifiers environment of the run -----------------------------
    async def start(self) -> None:
        self._users += 1
        if self._task is not None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        app = BodySizeLimit(ApiKeyGuard(self.app(), self.key), MAX_BODY)
        self._server = _QuietServer(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start
            await asyncio.sleep(0.01)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        logger.info("token gate for verifiers environments at %s", self.url)

    async def close(self) -> None:
        self._users -= 1
        if self._users > 0 or self._task is None or self._server is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._task, 5)
        self._task = None

    # episodes ------------------------------------------------------------------------------
    def open_episode(self, temperature: float, seed: int | None, sampling: SamplingConfig) -> str:
        episode = uuid.uuid4().hex
        self.episodes[episode] = EpisodeTurns(temperature, seed, sampling)
        return episode

    async def bind(self, session: str, episode: str) -> None:
        """The trace `session` plays `episode` (a worker said so as the trace began)."""
        if episode in self.episodes:
            self.sessions[session] = episode
            async with self._bound:
                self._bound.notify_all()

    def close_episode(self, episode: str) -> list[Turn]:
        """The episode's turns, in the order they were served; it takes no more."""
        gone = self.episodes.pop(episode, None)
        turns = gone.turns if gone is not None else []
        for session in [s for s, e in self.sessions.items() if e == episode]:
            del self.sessions[session]
        return turns

    def metrics(self) -> dict[str, float]:
        taken = {
            f"orchestrator/verifiers/gate_refused/{k}": float(v) for k, v in self.refusals.items()
        }
        self.refusals.clear()
        return taken

    # the routes ----------------------------------------------------------------------------
    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/inference/v1/generate", self.handle_generate, methods=["POST"]),
                Route("/v1/models", self.handle_models, methods=["GET"]),
                Route("/health", lambda request: JSONResponse({"status": "ok"}), methods=["GET"]),
            ]
        )

    async def handle_models(self, request: Request) -> JSONResponse:
        card = {
            "id": self.config.model.name,
            "object": "model",
            "owned_by": "asyncrl",
            "max_model_len": self.config.seq_len - 1,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def handle_generate(self, request: Request) -> JSONResponse:
        try:
            try:
                body = json.loads(await request.body())
            except ValueError as error:
                raise Refused("malformed", f"the body is not JSON: {error}") from None
            episode = await self._episode_of(request.headers.get(SESSION_HEADER))
            return JSONResponse(await self.generate(body, episode))
        except Refused as refused:
            self.refusals[refused.reason] += 1
            if refused.reason not in self._logged:
                self._logged.add(refused.reason)
                logger.warning("token gate: a turn was refused (%s): %s", refused.reason, refused)
            error = {"message": str(refused), "type": "BadRequestError", "code": refused.status}
            return JSONResponse({"error": error}, status_code=refused.status)

    async def _episode_of(self, session: str | None) -> EpisodeTurns:
        if not session:
            raise Refused("no_session", "no X-Session-ID: the turn cannot be attributed")
        deadline = time.monotonic() + BIND_WAIT_S
        async with self._bound:
            while session not in self.sessions:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Refused(
                        "unknown_session", f"session {session[:40]!r} plays no episode of this run"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._bound.wait(), left)
        episode = self.episodes.get(self.sessions[session])
        if episode is None:
            raise Refused("unknown_session", "the episode of this session is over")
        return episode

    async def generate(self, body: Any, episode: EpisodeTurns) -> dict[str, Any]:
        prompt, params = checked_request(body)
        config, sampling = self.config, episode.sampling
        temperature = params.get("temperature", episode.temperature)
        if not math.isclose(float(temperature), episode.temperature, rel_tol=0, abs_tol=1e-9):
            raise Refused(
                "temperature",
                f"temperature {temperature} is not the run's "
                f"{episode.temperature}: the trainer scores at the run's",
            )
        for name, value in (("top_p", sampling.top_p), ("top_k", sampling.top_k)):
            if name in params and params[name] != value:
                raise Refused(name, f"{name} {params[name]} is not the run's {value}")
        room = config.seq_len - len(prompt)
        if room <= 0:
            raise Refused(
                "context_full",
                f"Prompt length ({len(prompt)}) exceeds maximum "
                f"context length ({config.seq_len - 1}).",
            )
        limits = [room, params.get("max_tokens"), sampling.max_tokens]
        request: dict[str, Any] = {
            "model": self.model_name(),
            "prompt": prompt,
            "n": 1,
            "max_tokens": min(int(x) for x in limits if x is not None),
            "temperature": episode.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "min_tokens": sampling.min_tokens,
            "repetition_penalty": sampling.repetition_penalty,
            "logprobs": 0,
            "return_token_ids": True,
        }
        if params.get("stop_token_ids"):
            request["stop_token_ids"] = [int(t) for t in params["stop_token_ids"]]
        if episode.seed is not None:  # a seed of its own per turn
            request["seed"] = episode.seed + 1_000_003 * episode.requests
        episode.requests += 1
        version = self.clients.oldest_version()  # every token's, where the server gives none
        try:
            episode.server, (choice,), _ = await generate(
                self.clients, "completions", request, 1, episode.server
            )
        except RequestRejected as error:
            raise Refused("servers_refused", str(error)) from None
        except (GroupAborted, InferenceUnavailable, ServerError) as error:
            raise Refused("servers_unavailable", str(error), status=503) from None
        ids = list(choice.token_ids)
        versions = list(choice.policy_versions or [version] * len(ids))
        episode.turns.append(
            Turn(prompt, ids, list(choice.logprobs), versions, choice.finish_reason)
        )
        entries = [
            {"token": f"token_id:{t}", "token_id": t, "logprob": lp}
            for t, lp in zip(ids, choice.logprobs, strict=True)
        ]
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt) + len(ids),
        }
        return {
            "request_id": str(body.get("request_id") or uuid.uuid4().hex),
            "model": body.get("model") or config.model.name,
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "token_ids": ids,
                    "finish_reason": choice.finish_reason,
                    "logprobs": {"content": entries},
                    "policy_versions": versions,
                }
            ],
            "usage": usage,
        }


def checked_request(body: Any) -> tuple[list[int], dict[str, Any]]:
    """The prompt ids and sampling parameters of a generate request, or `Refused`."""
    if not isinstance(body, dict):
        raise Refused("malformed", "the body is not a JSON object")
    if "features" in body or "content_parts" in body:
        raise Refused("multimodal", "multimodal prompts are not served")
    unknown = sorted(set(body) - TOP_LEVEL)
    if unknown:
        raise Refused("unknown_key", f"unknown key {unknown[0]!r}")
    prompt = body.get("token_ids")
    if not (isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt)):
        raise Refused("malformed", "token_ids must be a non-empty list of token ids")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise Refused("malformed", "sampling_params must be an object")
    unknown = sorted(set(params) - SAMPLING)
    if unknown:
        raise Refused(
            "unknown_key",
            f"sampling key {unknown[0]!r} is not implemented by the "
            "run: its sampling is `orchestrator.sampling`",
        )
    if params.get("n", 1) != 1:
        raise Refused("unknown_key", "one completion per turn (n = 1)")
    return prompt, params


class _QuietServer(uvicorn.Server):
    """uvicorn inside the orchestrator's event loop, leaving its signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield
