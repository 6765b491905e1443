"""The inference servers as a pool: their lifecycle (start, probes, elastic discovery), the API
key from the environment, and weight updates that work against every engine.

A server that fails every retry is marked down (`generation.request`): its groups go to the
other servers, or wait for it (`generation.generate`). Once it answers again (restarted), the
orchestrator loads the newest weights into it before it takes work again (`revive`, `needing`).

Each server is reached at its OpenAI base URL (`http://host:port/v1`); admin routes live at the
server root. Which engine a server runs is learned once, when the pool first reaches it
(`engine_api.identify`); from then on every admin call goes through that engine's `EngineAPI`.
Rollouts ask through `generation.generate`, which owns a generate request end to end.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any, cast

import httpx

from asyncrl.config.orchestrator import ClientConfig
from asyncrl.log import get_logger
from asyncrl.orchestrator.engine_api import ENGINES, ChatTemplate, EngineAPI, identify
from asyncrl.orchestrator.generation import (
    RETRIES,
    InferenceUnavailable,
    RequestRejected,
    Server,
    ServerDown,
    ServerError,
    generate_on,
    least_loaded,
    request,
)
from asyncrl.orchestrator.weight_checks import (
    WeightCounters,
    WeightsNotServed,
    load_problem,
    pushed_problem,
    warn,
)
from asyncrl.transport.broadcast import Broadcast, read_broadcast
from asyncrl.transport.served_base import ServedBase
from asyncrl.waiting import Wait

logger = get_logger(__name__)


def unanswered(server: Server, error: Exception) -> None:
    """A server that answers its weights' version with an error (a 5xx after the retries, a
    4xx) is marked down, as one that does not answer: before this it was, and the run then
    stopped on a poll that `revive` would have mended."""
    if server.state == "up":
        logger.warning("%s did not say which weights it holds (%s): it takes no work until it "
                       "answers again", server.root, error)  # fmt: skip
    server.state = "down"


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
        self.weights = WeightCounters()  # how versions reached the servers, for the metrics

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
        wait = Wait(f"{server.root}/health", logger, self.config.startup_timeout,
                    key="orchestrator.client.startup_timeout")  # fmt: skip
        server.state = "down"  # until it answers: no "is down" warning while it starts
        while True:
            try:
                await self.request(server, "GET", f"{server.root}/health", retries=1)
                break
            except (InferenceUnavailable, ServerError) as error:
                try:
                    wait.check()
                except TimeoutError as timeout:
                    raise InferenceUnavailable(
                        f"{server.root} never came up: {error} ({timeout})"
                    ) from None
                await asyncio.sleep(1.0)
        if not self.config.skip_model_check and model_name is not None:
            try:
                models = await self.request(server, "GET", f"{server.base_url}/models")
            except RequestRejected as error:
                hint = ""
                if error.status in (401, 403):
                    hint = f" (the API key is ${self.config.api_key_var}: is it the server's?)"
                raise InferenceUnavailable(f"{error}{hint}") from None
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
            engine = await identify(self.http, server)
            api = ENGINES[engine](self.http, server, self.chat_prompt_ids)
            server.api = api
            server.version = await api.version() or 0
            logger.info("%s runs %s, weights version %d", server.root, engine, server.version)
        return cast(EngineAPI, server.api)  # set only here; `Server` types it as generation uses it

    # requests ------------------------------------------------------------------------------------
    async def request(
        self, server: Server, method: str, url: str, json: Any = None, retries: int = RETRIES
    ) -> Any:
        """`generation.request` with the pool's client: JSON from `url`, retried with backoff,
        the server marked down when every attempt fails."""
        return await request(self.http, server, method, url, json, retries)

    async def ask_once(
        self, server: Server, method: str, url: str, json: Any = None
    ) -> httpx.Response:
        """One request, its response whatever the status, the server's state untouched: for
        asking what a server can do (a 5xx there is an answer, not an outage)."""
        return await self.http.request(method, url, json=json)

    def least_loaded(self) -> Server:
        return least_loaded(self.servers)

    async def generate(
        self, server: Server, route: str, body: dict[str, Any], cost: int
    ) -> dict[str, Any]:
        """One request to `route` on `server`, no failover, no abort-retry
        (`generation.generate_on`): for asking one server directly; rollouts go through
        `generation.generate`."""
        return await generate_on(self, server, route, body, cost)

    def per_token_versions(self, server: Server) -> bool:
        return server.api is not None and cast(EngineAPI, server.api).per_token_versions

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
            except (InferenceUnavailable, ServerError, RequestRejected):
                server.state = "down"
                return
            server.state = "back"
            logger.info("%s answers again, at weights version %d", server.root, server.version)

        await asyncio.gather(*(probe(s) for s in self.servers if s.state == "down"))

    def mark_up(self, newest: Broadcast | None) -> None:
        """Servers that are back and now hold the newest weights take work again. One that gets
        its weights from the trainer itself (NCCL) may still wait for them: it stays back, as
        does one whose pushed weights are not those of the newest version's marker."""
        for server in self.servers:
            if server.state != "back":
                continue
            behind = newest is not None and server.version < newest.step
            if not behind and (newest is None or pushed_problem(server, newest) is None):
                server.state = "up"

    def hold_back_mismatched(self, marker_of: Callable[[int], Broadcast | None]) -> None:
        """Servers whose weights were pushed to them (NCCL, a colocated trainer) and whose
        fingerprint is not the one their version's marker (`marker_of(step)`) gives: no work
        until they hold a version that matches."""
        for server in self.servers:
            if server.state != "up":
                continue
            problem = pushed_problem(server, marker_of(server.version))
            if problem is not None:
                self.weights.mismatch_reloads += 1
                warn(server, problem, "it takes no work until it holds the trainer's weights")
                server.state = "back"

    async def _load_one(self, server: Server, broadcast: Broadcast, lora_name: str) -> None:
        """Load `broadcast` into the server and take its word that it holds it (`verified`:
        the fingerprint it checked the weights against). Other weights are loaded once more
        (a restarted trainer may have written the step again meanwhile); twice wrong, or
        refused as not the trainer's, stops the run naming the server and what differed."""
        api = await self.api(server)
        if broadcast.pushed:  # the server received it from the trainer itself
            server.version = await api.version() or server.version
            return
        if self.withdrawn(server, broadcast):
            logger.info(
                "%s leaves weights version %d, withdrawn by a trainer that resumed from an "
                "earlier checkpoint, for version %d", server.root, server.version, broadcast.step,
            )  # fmt: skip
        for attempt in range(2):
            info = await self._load_paused(api, broadcast, lora_name)
            self.weights.record(server, info)
            problem = load_problem(broadcast, info)
            if problem is None:
                break
            again = read_broadcast(broadcast.path)  # the same step, written again since?
            if again is not None and load_problem(again, info) is None:
                broadcast = again
                break
            if attempt:
                raise WeightsNotServed(
                    f"{server.root} does not hold weights version {broadcast.step} after "
                    f"loading it twice: {problem}"
                )
            self.weights.mismatch_reloads += 1
            warn(server, problem, "loading it once more")
        server.version, server.fingerprint = broadcast.step, broadcast.fingerprint

    async def _load_paused(
        self, api: EngineAPI, broadcast: Broadcast, lora_name: str
    ) -> dict[str, Any] | None:
        """One load, generation paused around it when `pause_for_updates` asks for it; a
        server that refuses the weights as not the trainer's stops the run."""
        pause = self.config.pause_for_updates
        if pause != "none":
            await api.pause(pause)
        try:
            if broadcast.kind == "lora":
                return await api.load_lora(lora_name, str(broadcast.path), broadcast.step)
            return await api.load_full(str(broadcast.path), broadcast.step)
        except RequestRejected as error:
            if error.status == 409:  # checked twice on the server: the files are not whole
                raise WeightsNotServed(
                    f"{api.root} refused weights version {broadcast.step} "
                    f"({broadcast.path}): {error.said}"
                ) from error
            raise
        finally:
            if pause != "none":
                await api.resume()

    async def refresh_versions(self) -> None:
        """Ask every server which weights it holds: a trainer may push weights to it without a
        broadcast directory (a colocated trainer syncs in memory after every step, an NCCL
        sender after every step, and a restarted one sends its checkpoint's weights)."""

        async def refresh(server: Server) -> None:
            try:
                version = await (await self.api(server)).version()
            except ServerDown:
                return  # marked down; `revive` takes over
            except (ServerError, RequestRejected) as error:  # it cannot say what it holds:
                unanswered(server, error)  # no work until `revive` finds it fit again
                return
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
        up = [server for server in self.servers if server.state == "up"]
        waits = [
            asyncio.ensure_future((await self.api(server)).version_change(server.version, timeout))
            for server in up
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
            if isinstance(error, ServerError | RequestRejected):
                server = next(s for s, w in zip(up, waits, strict=True) if w is wait)
                unanswered(server, error)
            elif error is not None and not isinstance(error, InferenceUnavailable):
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
