"""Talking to the inference servers: a pool with least-loaded routing, retries with backoff, the
API key from the environment, and weight updates that work against every engine.

Each server is reached at its OpenAI base URL (`http://host:port/v1`); admin routes live at the
server root. Which engine a server runs is learned once, when the pool first reaches it
(`engine_api.identify`); from then on every call goes through that engine's `EngineAPI`.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Any

import httpx

from asyncrl.config.orchestrator import ClientConfig
from asyncrl.log import get_logger
from asyncrl.orchestrator.engine_api import ENGINES, ChatTemplate, EngineAPI, identify
from asyncrl.transport.broadcast import Broadcast
from asyncrl.waiting import Wait

logger = get_logger(__name__)

RETRIES = 4
BACKOFF_S = 0.5


def _body(response: httpx.Response) -> Any:
    """JSON, or for the admin routes that answer in plain text (or nothing), that text."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    return {"text": response.text}


class InferenceUnavailable(RuntimeError):
    """A server did not answer after every retry; the message names it."""


@dataclass
class Server:
    base_url: str  # .../v1
    in_flight: int = 0
    version: int = 0
    api: EngineAPI | None = None  # set when the pool first reaches the server

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/").removesuffix("/v1")


class ClientPool:
    def __init__(
        self,
        config: ClientConfig,
        chat_prompt_ids: ChatTemplate | None = None,
    ) -> None:
        """`chat_prompt_ids` renders a chat as prompt token ids, for engines that take only ids."""
        self.config = config
        self.chat_prompt_ids = chat_prompt_ids
        headers = {"Authorization": f"Bearer {key}"} if (key := config.api_key()) else {}
        self.http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(config.timeout, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        self.servers = [Server(url) for url in config.base_url]
        self._discovery: asyncio.Task[None] | None = None

    # lifecycle -----------------------------------------------------------------------------------
    async def start(self, model_name: str | None) -> None:
        if self.config.elastic is not None:
            await self._discover()
            self._discovery = asyncio.create_task(self._keep_discovering())
        for server in self.servers:
            await self._probe(server, model_name)

    async def close(self) -> None:
        if self._discovery is not None:
            self._discovery.cancel()
        await self.http.aclose()

    async def _probe(self, server: Server, model_name: str | None) -> None:
        """Wait for the server to come up, check it serves the model, learn its engine and
        weights version."""
        wait = Wait(f"{server.root}/health", logger, self.config.startup_timeout)
        while True:
            try:
                await self.request(server, "GET", f"{server.root}/health", retries=1)
                break
            except InferenceUnavailable as error:
                try:
                    wait.check()
                except TimeoutError:
                    raise InferenceUnavailable(f"{server.root} never came up: {error}") from None
                await asyncio.sleep(1.0)
        if not self.config.skip_model_check and model_name is not None:
            models = await self.request(server, "GET", f"{server.base_url}/models")
            served = [entry["id"] for entry in models.get("data", [])]
            if model_name not in served:
                raise InferenceUnavailable(
                    f"{server.base_url} serves {served}, not `{model_name}` "
                    "(set client.skip_model_check to skip this check)"
                )
        await self.api(server)

    async def api(self, server: Server) -> EngineAPI:
        """The server's engine API, identified on first use."""
        if server.api is None:

            async def call(method: str, url: str, json: Any = None, retries: int = RETRIES) -> Any:
                return await self.request(server, method, url, json, retries)

            engine = await identify(call, server.root)
            api = ENGINES[engine](call, server.root, server.base_url, self.chat_prompt_ids)
            server.api = api
            server.version = await api.version() or 0
            logger.info("%s runs %s, weights version %d", server.root, engine, server.version)
        return server.api

    # requests ------------------------------------------------------------------------------------
    async def request(
        self, server: Server, method: str, url: str, json: Any = None, retries: int = RETRIES
    ) -> Any:
        """JSON from `url`, retrying connection errors and 5xx with exponential backoff
        (0.5, 1, 2 s); then InferenceUnavailable naming the URL and the last error."""
        last: Exception | None = None
        for attempt in range(retries):
            try:
                response = await self.http.request(method, url, json=json)
                if response.status_code < 500:
                    if response.status_code >= 400:
                        raise InferenceUnavailable(
                            f"{url} answered {response.status_code}: {response.text[:500]}"
                        )
                    return _body(response)
                last = RuntimeError(f"{response.status_code}: {response.text[:200]}")
            except httpx.TransportError as error:
                last = error
            if attempt + 1 < retries:
                await asyncio.sleep(BACKOFF_S * 2**attempt)
        raise InferenceUnavailable(f"{url} failed after {retries} attempts: {last}")

    def least_loaded(self) -> Server:
        return min(self.servers, key=lambda server: server.in_flight)

    async def generate(
        self, server: Server, route: str, body: dict[str, Any], cost: int
    ) -> dict[str, Any]:
        """One request to `route` (chat/completions or completions) on `server`; a whole group
        (`n` completions) is one request, so it stays on one server."""
        api = await self.api(server)
        server.in_flight += cost
        try:
            return await api.generate(route, body)
        finally:
            server.in_flight -= cost

    def per_token_versions(self, server: Server) -> bool:
        return server.api is not None and server.api.per_token_versions

    # weights -------------------------------------------------------------------------------------
    async def load(self, broadcast: Broadcast, lora_name: str) -> None:
        """Every server to `broadcast`'s weights (full checkpoint or LoRA adapter, in place),
        pausing generation around the load when `pause_for_updates` asks for it."""
        await asyncio.gather(*(self._load_one(s, broadcast, lora_name) for s in self.servers))

    async def _load_one(self, server: Server, broadcast: Broadcast, lora_name: str) -> None:
        api = await self.api(server)
        if broadcast.pushed:  # the server received it from the trainer itself
            server.version = await api.version() or server.version
            return
        pause = self.config.pause_for_updates
        if pause != "none":
            await api.pause(pause)
        try:
            if broadcast.kind == "lora":
                await api.load_lora(lora_name, str(broadcast.path), broadcast.step)
            else:
                await api.load_full(str(broadcast.path), broadcast.step)
        finally:
            if pause != "none":
                await api.resume()
        server.version = broadcast.step

    async def refresh_versions(self) -> None:
        """Ask every server which weights it holds: a trainer may push weights to it without a
        broadcast directory (a colocated trainer syncs in memory after every step)."""

        async def refresh(server: Server) -> None:
            api = await self.api(server)
            server.version = max(server.version, await api.version() or 0)

        await asyncio.gather(*(refresh(server) for server in self.servers))

    def oldest_version(self) -> int:
        return min(server.version for server in self.servers)

    # elastic discovery ---------------------------------------------------------------------------
    async def _discover(self) -> None:
        elastic = self.config.elastic
        assert elastic is not None
        infos = await asyncio.get_running_loop().getaddrinfo(
            elastic.hostname, elastic.port, type=socket.SOCK_STREAM
        )
        hosts = {info[4][0] for info in infos}
        urls = sorted(f"http://{f'[{h}]' if ':' in h else h}:{elastic.port}/v1" for h in hosts)
        known = {server.base_url: server for server in self.servers}
        self.servers = [known.get(url) or Server(url) for url in urls]
        if set(urls) != set(known):
            logger.info("elastic pool: %d server(s) at %s", len(urls), elastic.hostname)

    async def _keep_discovering(self) -> None:
        elastic = self.config.elastic
        assert elastic is not None
        while True:
            await asyncio.sleep(elastic.sync_interval)
            try:
                await self._discover()
            except OSError as error:
                logger.warning("elastic pool: cannot resolve %s (%s)", elastic.hostname, error)
