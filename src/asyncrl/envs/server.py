"""`asyncrl env-server`: one environment served over HTTP, for orchestrators elsewhere.

Sandboxes and heavy environments can live on machines of their own. The server loads the
environment for its examples and description, and runs every reward and every turn in its
worker processes (`RewardPool`: isolated, timed out, limited), exactly as an orchestrator does
for a local environment; the orchestrator's side is `remote.py`. JSON in and out, nothing
unpickled, loopback unless told otherwise, and a bearer key when `api_key_var` names one.

Routes: `GET /health`, `GET /info` (name, rubric, multi-turn and max_turns),
`POST /examples` {split, count}, `POST /score` {completion | messages, example, steps},
`POST /respond` {messages, example} -> {messages, done, tool_calls} or {error: {kind, message}}.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from asyncrl.config.env_server import EnvServerConfig
from asyncrl.envs.base import Example, Messages
from asyncrl.envs.multi_turn import is_multi_turn
from asyncrl.envs.registry import load_environment
from asyncrl.envs.reward_pool import EnvironmentFailed, RewardPool
from asyncrl.inference.api_key import ApiKeyGuard
from asyncrl.inference.body_limit import BodySizeLimit
from asyncrl.log import get_logger

logger = get_logger(__name__)


class ExamplesRequest(BaseModel):
    split: Literal["train", "eval"]
    count: int = Field(gt=0, le=1_000_000)


class ScoreRequest(BaseModel):
    completion: str | None = None
    messages: list[dict[str, Any]] | None = None
    example: dict[str, Any]
    steps: bool = False


class RespondRequest(BaseModel):
    messages: list[dict[str, Any]]
    example: dict[str, Any]


def example_of(fields: dict[str, Any]) -> Example:
    try:
        return Example(**fields)
    except TypeError as error:
        raise HTTPException(400, f"not an example: {error}") from None


def build_app(config: EnvServerConfig) -> FastAPI:
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
    if api_key := os.environ.get(config.api_key_var):  # added last: runs first
        app.add_middleware(ApiKeyGuard, api_key=api_key)

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
        }

    @app.post("/examples")
    async def examples(request: ExamplesRequest) -> list[dict[str, Any]]:
        return [asdict(example) for example in env.examples(request.split, request.count)]

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
    logger.info("env-server: %s on http://%s:%d", config.env.id, config.host, config.port)
    uvicorn.run(build_app(config), host=config.host, port=config.port, log_level="warning")
