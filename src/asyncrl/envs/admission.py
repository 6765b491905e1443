"""How much work the environment server takes on at once: admitted requests are bounded, the
rest refused at once with 503 before their body is read.

Each /score or /respond holds a worker for up to `timeout`, and one waiting for a worker holds
its body (up to `max_request_bytes`) in memory; with no bound, a burst of large requests to a
busy server grows its memory without limit. So at most `limit` work requests are in the
server at a time (the workers' share and `max_queued` more); the next gets 503 with
`Retry-After`, which the orchestrator's client retries with backoff. Probes (/health, /info)
are never refused.
"""

from __future__ import annotations

import json
from typing import Any

WORK_PATHS = frozenset({"/score", "/respond", "/examples"})


class Admission:
    """Pure ASGI middleware: at most `limit` requests to `WORK_PATHS` in flight."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_flight = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in WORK_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            await refuse(send, 503, f"busy: {self.in_flight} requests in progress or queued; "
                                    "retry later")  # fmt: skip
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


async def refuse(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "code": status}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")],
        }
    )
    await send({"type": "http.response.body", "body": body})
