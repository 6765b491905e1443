"""What one HTTP call to an inference server makes of the answer (`generation.request`): a 4xx
is the server judging the request, at once, never an outage; a 5xx other than the engine's own
"not now" is retried a bounded number of times and then named, not taken for a server that is
down and retried for ever; an answer from another start of the server is a restart, however
quickly the server came back. The real embedded app answers where it can (in process, through
httpx's ASGI transport); a stand-in answers what it cannot be made to (a 500, a restart)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from asyncrl.config.inference import InferenceConfig
from asyncrl.config.orchestrator import ClientConfig
from asyncrl.inference.served_model import ServedModel
from asyncrl.inference.server import build_app, load_served_model
from asyncrl.orchestrator import generation
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.engine_api import EngineAPI
from asyncrl.orchestrator.generation import (
    RequestRejected,
    ServerDown,
    ServerError,
    generate,
    request,
)
from asyncrl.web.server_instance import INSTANCE_HEADER

URL = "http://server:8000"


@pytest.fixture
def served(tiny_model_dir: Path) -> Iterator[ServedModel]:
    served = load_served_model(InferenceConfig(model=str(tiny_model_dir), max_model_len=64))
    yield served
    served.engine.shutdown()


def pool_on(transport: httpx.AsyncBaseTransport) -> ClientPool:
    pool = ClientPool(ClientConfig(base_url=[f"{URL}/v1"], startup_timeout=1))
    pool.http = httpx.AsyncClient(transport=transport)
    return pool


def stand_in(answer: Callable[[httpx.Request], httpx.Response]) -> httpx.MockTransport:
    return httpx.MockTransport(answer)


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generation, "BACKOFF_S", 0.001)


@pytest.mark.parametrize(
    ("prompt", "said"),
    [([999_999_999], "prompt token id 999999999 >= vocabulary size"),
     ([5] * 100, "prompt has 100 tokens; max_model_len is 64")],
)  # fmt: skip
def test_a_prompt_the_server_refuses_is_the_example_s_fault_not_an_outage(
    served: ServedModel, prompt: list[int], said: str
) -> None:
    """The run stopped on one such JSONL line: any 4xx read as "server unavailable"."""

    async def scenario() -> None:
        pool = pool_on(httpx.ASGITransport(app=build_app(InferenceConfig(model="m"), served)))
        body = {"model": served.name, "prompt": prompt, "max_tokens": 4, "logprobs": 0}
        with pytest.raises(RequestRejected, match=said) as refused:
            await generate(pool, "completions", body, 1)
        assert refused.value.status == 400 and refused.value.of_example
        assert pool.servers[0].state == "up"  # the server still takes work
        await pool.close()

    asyncio.run(scenario())


def test_a_5xx_that_is_not_the_engines_refusal_ends_after_the_retries_naming_the_call() -> None:
    """vLLM's reload failing answered 500: the server was marked down, revived, reloaded, and
    marked down again, for ever. The load now fails the step with what the server said."""
    calls: list[str] = []

    def failing_reload(sent: httpx.Request) -> httpx.Response:
        calls.append(sent.url.path)
        return httpx.Response(500, text="reload_weights failed: shapes differ")

    async def scenario() -> None:
        pool = pool_on(stand_in(failing_reload))
        server = pool.servers[0]
        api = EngineAPI(pool.http, server)
        with pytest.raises(ServerError, match=r"/collective_rpc answered 500 on 4 attempt\(s\): "
                           "reload_weights failed: shapes differ"):  # fmt: skip
            await api.load_full("/weights/step_1", 1)
        assert calls == ["/collective_rpc"] * 4
        assert server.state == "up"  # it answers: not down, and not revived and reloaded again
        await pool.close()

    asyncio.run(scenario())


def test_the_engines_own_refusal_and_a_dead_server_are_still_an_outage() -> None:
    """503 (a full queue) and no connection: asked again, then the server is marked down."""

    def busy(sent: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="32 sequences are queued; retry later")

    async def scenario() -> None:
        pool = pool_on(stand_in(busy))
        with pytest.raises(ServerDown, match="failed after 4 attempts: 503"):
            await request(pool.http, pool.servers[0], "GET", f"{URL}/v1/models")
        assert pool.servers[0].state == "down"
        await pool.close()

    asyncio.run(scenario())


def test_a_server_restarted_within_the_retries_is_noticed_and_reloaded_before_work() -> None:
    """Killed and back within 3.5 s of retries, the server looked merely slow: the pool went on
    taking it for one holding its weights (and adapter). Each start answers as itself."""
    starts = iter(["first", "first", "second", "second", "second", "second"])

    def answer(sent: httpx.Request) -> httpx.Response:
        content = {"version": 0} if sent.url.path == "/weight_info" else {}
        return httpx.Response(200, json=content, headers={INSTANCE_HEADER: next(starts)})

    async def scenario() -> None:
        pool = pool_on(stand_in(answer))
        server = pool.servers[0]
        server.api = EngineAPI(pool.http, server)
        await pool.request(server, "GET", f"{URL}/health")
        server.version, server.fingerprint = 7, "step-7"
        await pool.request(server, "GET", f"{URL}/health")  # the same start: nothing happens
        with pytest.raises(ServerDown, match="restarted"):
            await pool.request(server, "GET", f"{URL}/health")
        assert server.state == "down"
        await pool.revive()  # probed: back, with its own weights, until the newest are loaded
        assert (server.state, server.version, server.fingerprint) == ("back", 0, None)
        await pool.close()

    asyncio.run(scenario())


def test_every_answer_of_the_embedded_server_names_its_start(
    served: ServedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    monkeypatch.setenv("INSTANCE_TEST_KEY", "k3y")
    config = InferenceConfig(model="m", api_key_var="INSTANCE_TEST_KEY")
    first, second = TestClient(build_app(config, served)), TestClient(build_app(config, served))
    health, refused = first.get("/health"), first.get("/v1/models")  # no key: 401
    assert refused.status_code == 401
    assert health.headers[INSTANCE_HEADER] == refused.headers[INSTANCE_HEADER]
    assert second.get("/health").headers[INSTANCE_HEADER] != health.headers[INSTANCE_HEADER]
