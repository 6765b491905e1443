"""The orchestrator's client pool against real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from asyncrl.config.orchestrator import ClientConfig
from asyncrl.launch.inference_process import free_port, inference_server
from asyncrl.orchestrator.client import ClientPool, InferenceUnavailable

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two_servers(tiny_model_dir: Path) -> Iterator[list[str]]:
    env = {"POOL_KEY": "k3y"}
    with (
        inference_server(tiny_model_dir, "--api_key_var", "POOL_KEY", env=env) as first,
        inference_server(tiny_model_dir, "--api_key_var", "POOL_KEY", env=env) as second,
    ):
        yield [first, second]


def generated(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return float(re.search(r"^asyncrl:generation_tokens_total\S* (\S+)$", text, re.M)[1])


def pool_for(urls: list[str], **changes: object) -> ClientPool:
    return ClientPool(ClientConfig(base_url=[f"{u}/v1" for u in urls], **changes))


def test_groups_are_spread_over_the_least_loaded_servers(
    two_servers: list[str], tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POOL_KEY", "k3y")
    before = [generated(url) for url in two_servers]

    async def scenario() -> None:
        pool = pool_for(two_servers, api_key_var="POOL_KEY")
        await pool.start(str(tiny_model_dir))
        body = {"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 8,
                "ignore_eos": True}  # fmt: skip

        async def one() -> None:
            await pool.generate(pool.least_loaded(), "chat/completions", body, cost=2)

        await asyncio.gather(*(one() for _ in range(8)))
        assert all(server.in_flight == 0 for server in pool.servers)
        await pool.close()

    asyncio.run(scenario())
    after = [generated(url) for url in two_servers]
    assert all(a > b for a, b in zip(after, before, strict=True))  # both servers worked
    assert sum(after) - sum(before) == 8 * 2 * 8


def test_a_dead_server_is_retried_with_backoff_then_reported() -> None:
    url = f"http://127.0.0.1:{free_port()}"

    async def scenario() -> None:
        pool = pool_for([url], skip_model_check=True)
        started = time.monotonic()
        with pytest.raises(InferenceUnavailable, match=rf"{url}/health failed after 4 attempts"):
            await pool.request(pool.servers[0], "GET", f"{url}/health")
        assert time.monotonic() - started >= 0.5 + 1.0 + 2.0  # backoff between the 4 attempts
        await pool.close()

    asyncio.run(scenario())


def test_start_waits_for_a_server_that_is_still_loading_then_gives_up() -> None:
    url = f"http://127.0.0.1:{free_port()}"

    async def scenario() -> None:
        pool = pool_for([url], skip_model_check=True, startup_timeout=2.5)
        started = time.monotonic()
        with pytest.raises(InferenceUnavailable, match=rf"{url} never came up"):
            await pool.start("m")
        assert time.monotonic() - started >= 2.5
        await pool.close()

    asyncio.run(scenario())


def test_wrong_key_and_wrong_model_are_clear_errors(
    two_servers: list[str], monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    async def start(model: str, **changes: object) -> None:
        pool = pool_for(two_servers[:1], api_key_var="POOL_KEY", **changes)
        try:
            await pool.start(model)
        finally:
            await pool.close()

    monkeypatch.setenv("POOL_KEY", "wrong")
    with pytest.raises(InferenceUnavailable, match="401"):
        asyncio.run(start(str(tiny_model_dir)))
    monkeypatch.setenv("POOL_KEY", "k3y")
    with pytest.raises(InferenceUnavailable, match="not `other-model`"):
        asyncio.run(start("other-model"))
    asyncio.run(start("other-model", skip_model_check=True))  # skipped: no error


def test_elastic_discovery_resolves_a_hostname_to_servers(
    two_servers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POOL_KEY", "k3y")
    port = int(two_servers[0].rsplit(":", 1)[1])

    async def scenario() -> None:
        pool = pool_for(
            ["http://unused/v1"], api_key_var="POOL_KEY", skip_model_check=True,
            elastic={"hostname": "localhost", "port": port, "sync_interval": 0.1},
        )  # fmt: skip
        await pool.start(None)
        urls = [server.base_url for server in pool.servers]
        assert f"http://127.0.0.1:{port}/v1" in urls
        assert all(re.match(r"http://(\d+\.\d+\.\d+\.\d+|\[[0-9a-f:]+\]):\d+/v1", u) for u in urls)
        await asyncio.sleep(0.3)  # re-checks keep the pool (same answer)
        assert f"http://127.0.0.1:{port}/v1" in [s.base_url for s in pool.servers]
        await pool.close()

    asyncio.run(scenario())
