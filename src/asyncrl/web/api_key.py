"""The bearer API key, checked before anything else: an unauthenticated client gets a 401
before its body is read or parsed (a dependency on the route would run after both). Every
route but `OPEN_PATHS` needs it, websockets included (refused with close code 1008).

`EngineKeyGuard` is the same guard for vLLM's own app, which `asyncrl infer` hands to vLLM as
`--middleware`: vLLM's key guards only its `/v1` routes, and its development routes
(`/collective_rpc` runs any worker method; `/pause`, `/sleep`, `/reset_prefix_cache`) answer
anyone who reaches the port. Under this guard they need the key like everything else.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from asyncrl.run_secret import key_of
from asyncrl.secret_handover import receive_keys

OPEN_PATHS = frozenset({"/health", "/version", "/metrics"})  # what a load balancer probes
ENGINE_KEY_ENV = "VLLM_API_KEY"  # where vLLM (and `EngineKeyGuard` in its process) reads the key


class ApiKeyGuard:
    """Pure ASGI middleware: every path but `OPEN_PATHS` needs `Authorization: Bearer <key>`."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # before it is accepted: the server answers 403
            await send({"type": "websocket.close", "code": 1008})
            return
        error = {"message": "missing or wrong API key", "type": "AuthenticationError", "code": 401}
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": json.dumps({"error": error}).encode()})


class EngineKeyGuard(ApiKeyGuard):
    """`ApiKeyGuard` inside vLLM's API server (`--middleware`, which passes no arguments): the
    key `asyncrl infer` hands that process over a socket (`secret_handover.py`), else
    `$VLLM_API_KEY` (vLLM started by hand, the key in its environment anyway). Handed it, the
    process has marked itself not dumpable first: no other process of its user reads it there.
    Without a key it refuses to be built, so no request reaches vLLM unguarded."""

    def __init__(self, app: Any) -> None:
        receive_keys()  # makes this process not dumpable before it reads a key
        key = key_of(ENGINE_KEY_ENV)
        if not key:
            raise RuntimeError(
                f"EngineKeyGuard: ${ENGINE_KEY_ENV} is unset; it guards every route with that key"
            )
        super().__init__(app, key)
