"""The bearer API key, checked before anything else: an unauthenticated client gets a 401
before its body is read or parsed (a dependency on the route would run after both)."""

from __future__ import annotations

import hmac
import json
from typing import Any

OPEN_PATHS = frozenset({"/health", "/version", "/metrics"})  # what a load balancer probes


class ApiKeyGuard:
    """Pure ASGI middleware: every path but `OPEN_PATHS` needs `Authorization: Bearer <key>`."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
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
