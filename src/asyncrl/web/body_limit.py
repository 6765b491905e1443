"""Refuse request bodies over a size limit (413) before they are read into memory, and bodies
that take too long to arrive (408): a slow client must not hold a connection forever.

The body is read here, whole, before the app sees the request, and then handed on: an error
raised while the app itself reads would reach FastAPI's body parser, which reports any failure
as a 400.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

Scope = dict[str, Any]


class BodySizeLimit:
    """Pure ASGI middleware: checks Content-Length, counts the bytes of chunked bodies, and
    gives the whole body `read_timeout` seconds to arrive."""

    def __init__(self, app: Any, max_bytes: int, read_timeout: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout = read_timeout

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, 413, f"request body exceeds {self.max_bytes} bytes")
            return
        try:
            body = await asyncio.wait_for(self._read(receive), self.read_timeout)
        except _TooLarge:
            await self._refuse(send, 413, f"request body exceeds {self.max_bytes} bytes")
            return
        except TimeoutError:
            await self._refuse(send, 408, f"request body not received in {self.read_timeout} s")
            return
        if body is None:  # the client left before sending it all
            return
        delivered = False

        async def replay() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: only a disconnect can come

        await self.app(scope, replay, send)

    async def _read(self, receive: Any) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    @staticmethod
    async def _refuse(send: Any, status: int, message: str) -> None:
        kind = "RequestTooLarge" if status == 413 else "RequestTimeout"
        body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass
