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
- the HTTP call (`request`): connection errors and the answers of a server that cannot serve
  now (502, 503 — the engine's own refusal of a full queue —, 504, 408, 429) are retried with
  exponential backoff, and a server that fails every attempt is marked down. Any other 5xx is a
  server that answers but fails: retried the same, then `ServerError` names the URL and what it
  said (the server is not down, and asking it for ever would never end). A 4xx is the server
  judging the request: `RequestRejected` at once, never an outage; a rollout's caller skips the
  example for a rejection of its content (`RequestRejected.of_example`) and stops for the rest
  (a wrong key, an unknown model). A server whose answers carry another start identity
  (`INSTANCE_HEADER`) than before restarted, however quickly: it is marked down, so the pool
  loads the newest weights into it before it takes work again. The engine's API
  (`engine_api.py`) only translates a generate request and its answer; its admin calls use the
  same `request`.

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
from asyncrl.web.server_instance import INSTANCE_HEADER

if TYPE_CHECKING:
    from asyncrl.config.orchestrator import ClientConfig

logger = get_logger(__name__)

RETRIES = 4
BACKOFF_S = 0.5
ABORT_RETRIES = 2  # a pause with mode=abort, a server shutting down: worth asking again


# a server that cannot serve now, not one that fails: asked again, then taken for down
NOT_NOW = frozenset({408, 429, 502, 503, 504})
# a refusal of what was asked (a malformed or too long prompt, a token id the model lacks, a
# body over the size limit): another example would be served
OF_EXAMPLE = frozenset({400, 413, 422})


class InferenceUnavailable(RuntimeError):
    """A server did not answer after every retry; the message names it."""


class ServerDown(InferenceUnavailable):
    """Connection errors, or a server that could not serve now, on every retry (or a server
    that restarted): the server is marked down until it answers."""


class ServerError(RuntimeError):
    """The server answered a 5xx (not one of NOT_NOW) on every retry: it is up but fails this
    call (vLLM's weight reload failing, say). Not retried further; the message names the URL,
    the status and what the server said."""


class RequestRejected(RuntimeError):
    """The server refused the request with a 4xx: an answer, not an outage."""

    def __init__(self, url: str, status: int, said: str) -> None:
        super().__init__(f"{url} refused the request with {status}: {said}")
        self.url, self.status, self.said = url, status, said

    @property
    def of_example(self) -> bool:
        """A refusal of the request's content (one example's prompt), not of every request."""
        return self.status in OF_EXAMPLE


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
    instance: str | None = None  # the start identity it answers with, when it gives one
    # the fingerprint it last reported for what it serves (None: not asked, or cannot say)
    reported: str | None = None
    reloads_seen: int = 0  # its count of weight reloads when it last reported one

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
                                    clients.config.startup_timeout,
                                    key="orchestrator.client.startup_timeout")  # fmt: skip
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
    """JSON from `url` on `server`. Connection errors and NOT_NOW answers are retried with
    exponential backoff (0.5, 1, 2 s); then the server is marked down and ServerDown names the
    URL and the last error. Another 5xx is retried the same, then ServerError. A 4xx is an
    answer: RequestRejected with the server's reason, at once. An answer from a new start of
    the server is ServerDown, the server marked down (`noticed_restart`)."""
    last: Exception | None = None
    for attempt in range(retries):
        try:
            response = await http.request(method, url, json=json)
        except httpx.TransportError as error:
            last = error
        else:
            noticed_restart(server, response)
            status = response.status_code
            if status < 400:
                return _body(response)
            if status < 500 and status not in NOT_NOW:
                raise RequestRejected(url, status, response.text[:500])
            last = RuntimeError(f"{status}: {response.text[:500]}")
            if status not in NOT_NOW:
                last = ServerError(
                    f"{url} answered {status} on {attempt + 1} attempt(s): {response.text[:500]}"
                )
        if attempt + 1 < retries:
            await asyncio.sleep(BACKOFF_S * 2**attempt)
    if isinstance(last, ServerError):
        raise last
    if server.state == "up":
        logger.warning(
            "%s is down (%s); its work goes to other servers or waits for it to come back",
            server.root, last,
        )  # fmt: skip
    server.state = "down"
    raise ServerDown(f"{url} failed after {retries} attempts: {last}")


def noticed_restart(server: Server, response: httpx.Response) -> None:
    """Raise ServerDown, marking the server down, when `response` comes from another start of
    a server that takes work than the one the pool knows: killed and back within the retries,
    it holds its own weights (not the pool's, nor its adapter), and only a probe and a reload
    (`client.revive`, `client.needing`) make it fit for work again. A server not up (starting,
    down, back) is learning its identity: taken as given."""
    instance = response.headers.get(INSTANCE_HEADER)
    if instance is None:
        return
    known, server.instance = server.instance, instance
    if known is not None and known != instance and server.state == "up":
        server.state = "down"
        logger.warning("%s restarted (it answers as another server start): it takes no work "
                       "until it holds the newest weights again", server.root)  # fmt: skip
        raise ServerDown(f"{server.root} restarted (start {known} is now {instance})")


def _body(response: httpx.Response) -> Any:
    """JSON, or for the admin routes that answer in plain text (or nothing), that text."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    return {"text": response.text}
