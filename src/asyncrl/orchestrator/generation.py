"""One generate request, end to end, and the HTTP call every request to a server makes.

A rollout asks for completions with `generate`; everything between that call and the server's
answer happens here, in three loops read from the outside in:

- abort-retry: a completion the server aborted (a weight update with `pause_for_updates: abort`,
  a server shutting down) is cut short, not finished, so the whole request is asked again,
  `abort_retries` times, then `GroupAborted`;
- failover: the request goes to the preferred server while it is up (an episode's next turn goes
  where its prefix is cached), else to the least-loaded one that is up; a server that goes down
  midway hands the request to another, or it waits for one to come back
  (`client.startup_timeout`);
- the HTTP call (`request`): connection errors and 5xx are retried with exponential backoff, and
  a server that fails every attempt is marked down. The engine's API (`engine_api.py`) only
  translates a generate request and its answer; its admin calls use the same `request`.

The pool of servers, their weights and their lifecycle are `client.py`'s. Both modules import
this one, so it sees them only as what it uses of them, `ServerPool` (`client.ClientPool`) and
`GenerateAPI` (`engine_api.EngineAPI`), and imports neither.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import httpx

from asyncrl.log import get_logger
from asyncrl.waiting import Wait

if TYPE_CHECKING:
    from asyncrl.config.orchestrator import ClientConfig

logger = get_logger(__name__)

RETRIES = 4
BACKOFF_S = 0.5
ABORT_RETRIES = 2  # a pause with mode=abort, a server shutting down: worth asking again


class InferenceUnavailable(RuntimeError):
    """A server did not answer after every retry; the message names it."""


class ServerDown(InferenceUnavailable):
    """Connection errors or 5xx on every retry: the server is marked down until it answers."""


class GroupAborted(Exception):
    """The server aborted a completion of the group on every attempt: nothing to train."""


# a server's life as the pool sees it: `up` takes work; `down` failed and is probed; `back`
# answers again (restarted) and takes work once it holds the newest weights
ServerState = Literal["up", "down", "back"]


class GenerateAPI(Protocol):
    """What a generate request needs of a server's engine API (`engine_api.EngineAPI`): the
    translation of a request into the engine's call and of its answer into the OpenAI shape."""

    def generate_call(self, route: str, body: dict[str, Any]) -> tuple[str, Any]: ...

    def generate_answer(self, route: str, sent: Any, answer: Any) -> dict[str, Any]: ...


@dataclass
class Server:
    base_url: str  # .../v1
    in_flight: int = 0
    version: int = 0
    # the broadcast this pool loaded into it: a restarted trainer may publish a step again
    # with other weights, and the number alone would not tell them apart (None: not known)
    fingerprint: str | None = None
    api: GenerateAPI | None = None  # set when the pool first reaches the server
    state: ServerState = "up"
    # the fingerprint of the trainer's served base this pool loaded into it (QLoRA's
    # dequantized base; None: the server's own base)
    base: str | None = None

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/").removesuffix("/v1")


@dataclass(frozen=True)
class Completion:
    """One choice of a chat or text completion response, in one shape."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    prompt_ids: list[int]
    policy_versions: list[int] | None  # embedded engine only; vLLM has no such field

    @classmethod
    def parse(cls, choice: dict[str, Any], response: dict[str, Any]) -> Completion:
        if "message" in choice:  # chat: prompt ids at the top level, logprobs under `content`
            text = choice["message"]["content"] or ""
            logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
            prompt_ids = response["prompt_token_ids"]
        else:
            text = choice["text"]
            logprobs = list(choice["logprobs"]["token_logprobs"])
            prompt_ids = choice["prompt_token_ids"]
        return cls(
            choice["index"], text, choice["token_ids"], logprobs, choice["finish_reason"],
            prompt_ids, choice.get("policy_versions"),
        )  # fmt: skip


class ServerPool(Protocol):
    """What a generate request needs of the pool (`client.ClientPool`): its servers, how long
    to wait for one to come back, its HTTP client, and a server's engine API."""

    @property
    def servers(self) -> list[Server]: ...

    @property
    def config(self) -> ClientConfig: ...

    @property
    def http(self) -> httpx.AsyncClient: ...

    async def api(self, server: Server) -> GenerateAPI: ...


async def generate(
    clients: ServerPool,
    route: str,
    body: dict[str, Any],
    n: int,
    prefer: Server | None = None,
    abort_retries: int = ABORT_RETRIES,
) -> tuple[Server, list[Completion], int]:
    """`n` completions of `body` on `route` (chat/completions or completions), in index order,
    the server that made them, and how many times they were asked again. A whole group (`n`
    completions) is one request, so it stays on one server; siblings are each other's baseline,
    so one aborted completion makes the whole request asked again."""
    for retries in range(abort_retries + 1):
        wait: Wait | None = None
        while True:  # failover: until a server that is up answers
            if not any(server.state == "up" for server in clients.servers):
                wait = wait or Wait("an inference server to come back", logger,
                                    clients.config.startup_timeout)  # fmt: skip
                try:
                    wait.check()
                except TimeoutError as error:
                    raise InferenceUnavailable(f"every server is down: {error}") from None
                await asyncio.sleep(0.2)
                continue
            if prefer is not None and prefer.state == "up":
                server = prefer
            else:
                server = least_loaded(clients.servers)
            try:
                response = await generate_on(clients, server, route, body, n)
                break
            except ServerDown:
                continue  # marked down: another server, or this one once it is back
        choices = sorted(
            (Completion.parse(choice, response) for choice in response["choices"]),
            key=lambda choice: choice.index,
        )
        if not any(choice.finish_reason == "abort" for choice in choices):
            return server, choices, retries
    raise GroupAborted(f"the server aborted the request {abort_retries + 1} times")


async def generate_on(
    clients: ServerPool, server: Server, route: str, body: dict[str, Any], cost: int
) -> dict[str, Any]:
    """One request on `server`, answered in the OpenAI shape whatever its engine; `cost`
    (completions asked for) counts against the server's load while it runs."""
    api = server.api or await clients.api(server)  # identified at start, or here on first use
    server.in_flight += cost
    try:
        url, payload = api.generate_call(route, body)
        answer = await request(clients.http, server, "POST", url, payload)
        return api.generate_answer(route, payload, answer)
    finally:
        server.in_flight -= cost


def least_loaded(servers: list[Server]) -> Server:
    """The server that is up with the fewest completions in flight (any, while none is up)."""
    up = [server for server in servers if server.state == "up"] or servers
    return min(up, key=lambda server: server.in_flight)


async def request(
    http: httpx.AsyncClient,
    server: Server,
    method: str,
    url: str,
    json: Any = None,
    retries: int = RETRIES,
) -> Any:
    """JSON from `url` on `server`, retrying connection errors and 5xx with exponential backoff
    (0.5, 1, 2 s); then the server is marked down and ServerDown names the URL and the last
    error. A 4xx is an answer, not an outage: InferenceUnavailable with the server's reason."""
    last: Exception | None = None
    for attempt in range(retries):
        try:
            response = await http.request(method, url, json=json)
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


def _body(response: httpx.Response) -> Any:
    """JSON, or for the admin routes that answer in plain text (or nothing), that text."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    return {"text": response.text}
