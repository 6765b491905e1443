"""What the orchestrator asks a vLLM server before its first rollout: whether it runs asyncrl's
worker extension, which refreshes a tied LM head after a reload. The server here is a stand-in
that answers /collective_rpc as vLLM does (500 naming the missing method) — starting a real
vLLM without the extension costs a minute; the real one with it is the engine contract's
`test_reload_of_a_tied_lm_head`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.orchestrator import ClientConfig
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.engine_api import EngineAPI
from asyncrl.orchestrator.startup_checks import check_engine_limits
from asyncrl.transport.vllm_worker_extension import EXTENSION


def vllm_stand_in(with_extension: bool) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/collective_rpc"
        if with_extension:
            return httpx.Response(200, json={"results": [EXTENSION]})
        message = "Worker failed: 'CPUWorker' object has no attribute 'asyncrl_extension'"
        return httpx.Response(500, json={"error": {"message": message, "code": 500}})

    return httpx.MockTransport(answer)


def check(model: Path, with_extension: bool) -> ClientPool:
    pool = ClientPool(ClientConfig(base_url=["http://vllm:8000/v1"]))
    server = pool.servers[0]
    server.api = EngineAPI(pool.request, server.root, server.base_url)  # type: ignore[arg-type]
    server.state = "up"

    async def run() -> None:
        pool.http = httpx.AsyncClient(transport=vllm_stand_in(with_extension))
        try:
            await check_engine_limits(pool, str(model))
        finally:
            await pool.http.aclose()

    asyncio.run(run())
    return pool


def model_dir(tmp_path: Path, tied: bool) -> Path:
    config = {"model_type": "llama", "tie_word_embeddings": tied}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_server_with_the_extension_reloads_through_it(tmp_path: Path) -> None:
    pool = check(model_dir(tmp_path, tied=True), with_extension=True)
    assert pool.servers[0].api.reload_method == "asyncrl_reload_weights"  # type: ignore[union-attr]
    assert pool.servers[0].state == "up"


def test_a_tied_model_on_a_server_without_the_extension_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"runs without asyncrl's worker extension.*{EXTENSION}"):
        check(model_dir(tmp_path, tied=True), with_extension=False)


def test_an_untied_model_on_a_server_without_the_extension_uses_vllms_reload(
    tmp_path: Path,
) -> None:
    pool = check(model_dir(tmp_path, tied=False), with_extension=False)
    assert pool.servers[0].api.reload_method == "reload_weights"  # type: ignore[union-attr]
    assert pool.servers[0].state == "up"  # asking was not taken for an outage
