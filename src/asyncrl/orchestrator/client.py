"""Talking to the inference servers: a pool with least-loaded routing, retries with backoff, the
API key from the environment, and weight updates that work against every engine.

A server that fails every retry is marked down: its groups go to the other servers, or wait for
it (up to `client.startup_timeout`). Once it answers again (restarted), the orchestrator loads
the newest weights into it before it takes work again (`revive`, `needing`).

Each server is reached at its OpenAI base URL (`http://host:port/v1`); admin routes live at the
server root. Which engine a server runs is learned once, when the pool first reaches it
(`engine_api.identify`); from then on every call goes through that engine's `EngineAPI`.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from asyncrl.config.orchestrator import ClientConfig
from asyncrl.log import get_logger
from asyncrl.orchestrator.engine_api import ENGINES, ChatTemplate, EngineAPI, identify
from asyncrl.transport.broadcast import Broadcast
from asyncrl.transport.served_base import ServedBase
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


class ServerDown(InferenceUnavailable):
    """Connection errors or 5xx on every retry: the server is marked down until it answers."""


# a server's life as the pool sees it: `up` takes work; `down` failed and is probed; `back`
# answers again (restarted) and takes work once it holds the newest weights
ServerState = Literal["up", "down", "back"]


@dataclass
class Server:
    base_url: str  # .../v1
    in_flight: int = 0
    version: int = 0
    # the broadcast this pool loaded into it: a restarted trainer may publish a step again
    # with other weights, and the number alone would not tell them apart (None: not known)
    fingerprint: str | None = None
    api: EngineAPI | None = None  # set when the pool first reaches the server
    state: ServerState = "up"
    # the fingerprint of the trainer's served base this pool loaded into it (QLoRA's
    # dequantized base; None: the server's own base)
    base: str | None = None

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
        server.state = "down"  # until it answers: no "is down" warning while it starts
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
        server.state = "up"

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
        if server.state == "up":
            logger.warning(
                "%s is down (%s); its work goes to other servers or waits for it to come back",
                server.root, last,
            )  # fmt: skip
        server.state = "down"
        raise ServerDown(f"{url} failed after {retries} attempts: {last}")

    async def ask_once(
        self, server: Server, method: str, url: str, json: Any = None
    ) -> httpx.Response:
        """One request, its response whatever the status, the server's state untouched: for
        asking what a server can do (a 5xx there is an answer, not an outage)."""
        return await self.http.request(method, url, json=json)

    def least_loaded(self) -> Server:
        up = [server for server in self.servers if server.state == "up"] or self.servers
        return min(up, key=lambda server: server.in_flight)

    async def generate_anywhere(
        self, route: str, body: dict[str, Any], cost: int, prefer: Server | None = None
    ) -> tuple[Server, dict[str, Any]]:
        """`generate` on `prefer` while it is up (an episode's next turn goes where its prefix
        is cached), else on the least-loaded server that is up; when a server goes down midway
        the request goes to another, or waits until one is back (`client.startup_timeout`)."""
        wait: Wait | None = None
        while True:
            if not any(server.state == "up" for server in self.servers):
                wait = wait or Wait("an inference server to come back", logger,
                                    self.config.startup_timeout)  # fmt: skip
                try:
                    wait.check()
                except TimeoutError as error:
                    raise InferenceUnavailable(f"every server is down: {error}") from None
                await asyncio.sleep(0.2)
                continue
            server = prefer if prefer is not None and prefer.state == "up" else self.least_loaded()
            try:
                return server, await self.generate(server, route, body, cost)
            except ServerDown:
                continue  # marked down: another server, or this one once it is back

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
    async def load(
        self, broadcast: Broadcast, lora_name: str, servers: list[Server] | None = None
    ) -> None:
        """Every server (or those given) to `broadcast`'s weights (full checkpoint or LoRA
        adapter, in place), pausing generation around the load when `pause_for_updates` asks
        for it. A server that is down meanwhile is skipped: it is loaded when it is back."""
        targets = self.servers if servers is None else servers
        results = await asyncio.gather(
            *(self._load_one(s, broadcast, lora_name) for s in targets), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, ServerDown):
                raise result

    async def load_served_base(self, base: ServedBase) -> None:
        """The trainer's served base into every server that takes work and lacks it (all at
        the start, later one back from a restart), as weights version 0: the trainer's initial
        policy, its adapters being zero then. Adapters are loaded after it, onto it."""
        targets = [s for s in self.servers if s.state != "down" and s.base != base.fingerprint]
        results = await asyncio.gather(
            *(self._load_base(s, base) for s in targets), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, ServerDown):
                raise result

    async def _load_base(self, server: Server, base: ServedBase) -> None:
        api = await self.api(server)
        pause = self.config.pause_for_updates
        if pause != "none":
            await api.pause(pause)
        try:
            await api.load_full(str(base.path), 0)
        finally:
            if pause != "none":
                await api.resume()
        server.version, server.fingerprint, server.base = 0, None, base.fingerprint
        logger.info("%s holds the trainer's served base (%s)", server.root, base.fingerprint)

    def needing(self, broadcast: Broadcast) -> list[Server]:
        """Servers that should load `broadcast`: older weights, or (files only) weights from a
        future the restarted trainer withdrew — newer than any broadcast, or of the same step
        but other weights (the restarted trainer redid it before this pool saw it go back)."""
        return [
            server
            for server in self.servers
            if server.state != "down"
            and (
                server.version < broadcast.step
                or (not broadcast.pushed and self.withdrawn(server, broadcast))
                or server.state == "back"
            )
        ]

    @staticmethod
    def withdrawn(server: Server, broadcast: Broadcast) -> bool:
        """The server holds weights the trainer no longer has: a later step, or the same step
        with other weights than those this pool loaded (unknown ones are taken as the same)."""
        if server.version > broadcast.step:
            return True
        known = server.fingerprint
        return server.version == broadcast.step and known not in (None, broadcast.fingerprint)

    async def revive(self) -> None:
        """Probe the servers that are down; one that answers is `back`, with its own (restarted)
        weights version, until the newest weights are loaded into it (`mark_up`)."""

        async def probe(server: Server) -> None:
            try:
                await self.request(server, "GET", f"{server.root}/health", retries=1)
                server.version = (await (await self.api(server)).version()) or 0
                server.fingerprint = server.base = None  # a restarted server: its own weights
            except InferenceUnavailable:
                server.state = "down"
                return
            server.state = "back"
            logger.info("%s answers again, at weights version %d", server.root, server.version)

        await asyncio.gather(*(probe(s) for s in self.servers if s.state == "down"))

    def mark_up(self, newest: Broadcast | None) -> None:
        """Servers that are back and now hold the newest weights take work again. One that gets
        its weights from the trainer itself (NCCL) may still wait for them: it stays back."""
        for server in self.servers:
            if server.state == "back" and (newest is None or server.version >= newest.step):
                server.state = "up"

    async def _load_one(self, server: Server, broadcast: Broadcast, lora_name: str) -> None:
        api = await self.api(server)
        if broadcast.pushed:  # the server received it from the trainer itself
            server.version = await api.version() or server.version
            return
        if self.withdrawn(server, broadcast):
            logger.info(
                "%s leaves weights version %d, withdrawn by a trainer that resumed from an "
                "earlier checkpoint, for version %d", server.root, server.version, broadcast.step,
            )  # fmt: skip
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
        server.version, server.fingerprint = broadcast.step, broadcast.fingerprint

    async def refresh_versions(self) -> None:
        """Ask every server which weights it holds: a trainer may push weights to it without a
        broadcast directory (a colocated trainer syncs in memory after every step, an NCCL
        sender after every step, and a restarted one sends its checkpoint's weights)."""

        async def refresh(server: Server) -> None:
            try:
                version = await (await self.api(server)).version()
            except ServerDown:
                return  # marked down; `revive` takes over
            if version is None:
                return
            if version < server.version:
                logger.info(
                    "%s went back from weights version %d to %d: the trainer resumed from an "
                    "earlier checkpoint, or the server restarted", server.root, server.version,
                    version,
                )  # fmt: skip
            if version < server.version:  # perhaps restarted, from its own base
                server.base = None
            if version != server.version:  # weights this pool did not load
                server.version, server.fingerprint = version, None

        await asyncio.gather(*(refresh(s) for s in self.servers if s.state == "up"))

    async def version_change(self, timeout: float) -> None:
        """Return once any server that takes work reports weights other than those the pool
        knows it holds (a trainer pushed them: colocated, NCCL), or after `timeout`."""
        waits = [
            asyncio.ensure_future((await self.api(server)).version_change(server.version, timeout))
            for server in self.servers
            if server.state == "up"
        ]
        if not waits:
            await asyncio.sleep(timeout)
            return
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in pending:
            wait.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for wait in done:  # a server that went down is `refresh_versions`' and `revive`'s
            error = wait.exception()
            if error is not None and not isinstance(error, InferenceUnavailable):
                raise error

    def oldest_version(self) -> int:
        """The oldest weights among the servers that take work (-1 while none does)."""
        return min((s.version for s in self.servers if s.state == "up"), default=-1)

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
