"""`asyncrl env-server`: one environment served over HTTP, for orchestrators elsewhere.

Sandboxes and heavy environments can live on machines of their own. The server loads the
environment for its examples and description, and runs every reward and every turn in its
worker processes (`RewardPool`: isolated, timed out, limited), exactly as an orchestrator does
for a local environment; the orchestrator's side is `remote.py`. JSON in and out, nothing
unpickled, loopback unless told otherwise, and a bearer key when `api_key_var` names one: off
loopback the server refuses to start without one.

Bounded: request bodies (`max_request_bytes`), connections (`max_connections`), work admitted
at once (the workers plus `max_queued`, `admission.py`), examples per request
(`max_examples_per_request`) and the time to make them (`examples_timeout`, off the event loop,
one request at a time, so /health always answers). A failed turn is answered with its kind and
the exception's last line, never a traceback (that goes to the server's log).

Routes: `GET /health`, `GET /info` (name, rubric, multi-turn and max_turns, capacity),
`POST /examples` {split, count}, `POST /score` {completion | messages, example, steps},
`POST /respond` {messages, example} -> {messages, done, tool_calls} or {error: {kind, message}}.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, HTTPException, Response
from pydantic import BaseModel, Field, field_validator

from asyncrl.config.base import ConfigError
from asyncrl.config.env_server import EnvServerConfig
from asyncrl.envs.admission import Admission
from asyncrl.envs.base import Example, Messages
from asyncrl.envs.multi_turn import is_multi_turn
from asyncrl.envs.registry import load_environment
from asyncrl.envs.reward_pool import EnvironmentFailed, RewardPool
from asyncrl.log import get_logger
from asyncrl.run_secret import RUN_SECRET_ENV, is_loopback, server_key, withhold
from asyncrl.user_code import pass_through
from asyncrl.web.api_key import ApiKeyGuard
from asyncrl.web.body_limit import BodySizeLimit

logger = get_logger(__name__)


class ExamplesRequest(BaseModel):
    split: Literal["train", "eval"]
    count: int = Field(gt=0)


class ScoreRequest(BaseModel):
    completion: str | None = None
    messages: list[dict[str, Any]] | None = None
    example: dict[str, Any]
    steps: bool = False


class RespondRequest(BaseModel):
    messages: list[dict[str, Any]]
    example: dict[str, Any]

    @field_validator("messages")
    @classmethod
    def ends_with_a_model_turn(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not messages or messages[-1].get("role") != "assistant":
            raise ValueError("a turn to answer ends with the model's message (role assistant)")
        return messages


def example_of(fields: dict[str, Any]) -> Example:
    try:
        return Example(**fields)
    except TypeError as error:
        raise HTTPException(400, f"not an example: {error}") from None


def api_key_of(config: EnvServerConfig) -> str | None:
    """The key the server requires (`$<api_key_var>`, else the run's secret's key for that
    variable: `run_secret.server_key`); without one, only a loopback host is allowed."""
    api_key = server_key(config.api_key_var)
    if api_key is None and not is_loopback(config.host):
        raise ConfigError(
            f"env-server: `host` {config.host} serves other machines but ${config.api_key_var} "
            f"is unset (and no ${RUN_SECRET_ENV} to derive one from): anyone who reaches the "
            "port could run its environment's code. Set a key there (the orchestrator sends "
            "the one in its `env[].api_key_var`), or serve on 127.0.0.1"
        )
    if api_key is None:
        logger.warning(
            "env-server: no API key ($%s and $%s unset): every process on this machine may use "
            "it", config.api_key_var, RUN_SECRET_ENV,
        )  # fmt: skip
    return api_key


def build_app(config: EnvServerConfig) -> FastAPI:
    api_key = api_key_of(config)
    withhold(config.api_key_var)  # the workers run the environment's code: not its key
    pass_through(*config.env_passthrough)
    env = load_environment(config.env.id, config.env.args)
    pool = RewardPool(
        config.env.id, config.env.args, env.rubric, num_workers=config.workers,
        timeout=config.timeout, memory_limit=config.memory_limit, cpu_limit=config.cpu_limit,
    )  # fmt: skip

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        yield
        await pool.close()

    app = FastAPI(title="asyncrl environment", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.add_middleware(BodySizeLimit, max_bytes=config.max_request_bytes)
    # before the body is read: a request that will not be admitted costs no memory
    app.add_middleware(Admission, limit=config.workers + config.max_queued)
    if api_key is not None:  # added last: runs first
        app.add_middleware(ApiKeyGuard, api_key=api_key)
    examples_lock = asyncio.Lock()  # one /examples at a time: each may be large

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/info")
    async def info() -> dict[str, Any]:
        return {
            "name": env.name,
            "rubric": [{"name": term.name, "weight": term.weight} for term in env.rubric],
            "multi_turn": is_multi_turn(env),
            "max_turns": env.max_turns if is_multi_turn(env) else None,
            # requests it admits at once: a client that sends no more is never refused
            "capacity": config.workers + config.max_queued,
        }

    def encoded_examples(split: Literal["train", "eval"], count: int) -> bytes:
        return json.dumps([asdict(example) for example in env.examples(split, count)]).encode()

    @app.post("/examples")
    async def examples(request: ExamplesRequest) -> Response:
        if request.count > config.max_examples_per_request:
            raise HTTPException(
                422,
                f"count {request.count} is over this server's "
                f"max_examples_per_request, {config.max_examples_per_request}",
            )
        await examples_lock.acquire()
        work = asyncio.ensure_future(
            asyncio.to_thread(encoded_examples, request.split, request.count)
        )
        work.add_done_callback(lambda _: examples_lock.release())  # when the thread is done
        try:
            body = await asyncio.wait_for(asyncio.shield(work), config.examples_timeout)
        except TimeoutError:
            raise HTTPException(504, f"examples not made in {config.examples_timeout} s") from None
        return Response(body, media_type="application/json")

    @app.post("/score")
    async def score(request: ScoreRequest) -> dict[str, Any]:
        scored: str | Messages = (
            request.messages if request.messages is not None else request.completion or ""
        )
        result = await pool.score(scored, example_of(request.example), steps=request.steps)
        return asdict(result)

    @app.post("/respond")
    async def respond(request: RespondRequest) -> dict[str, Any]:
        try:
            reply = await pool.respond(request.messages, example_of(request.example))
        except EnvironmentFailed as failure:
            return {"error": {"kind": failure.kind, "message": str(failure)}}
        return {
            "messages": reply.messages,
            "done": reply.done,
            "tool_calls": [[record.tool, record.error] for record in reply.tool_calls],
        }

    return app


def run_env_server(config: EnvServerConfig) -> None:
    app = build_app(config)
    logger.info("env-server: %s on http://%s:%d", config.env.id, config.host, config.port)
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning",
                limit_concurrency=config.max_connections)  # fmt: skip
