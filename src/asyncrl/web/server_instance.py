"""Every answer of a server says which start of it answers (a random identity made when the
app is built): a client that sees it change knows the server restarted, however quickly it
came back — a server killed and restarted within a client's retries looks merely slow, and
would be taken to hold the weights and adapter it held before (`orchestrator/generation.py`)."""

from __future__ import annotations

import secrets
from typing import Any

INSTANCE_HEADER = "x-asyncrl-instance"


class ServerInstance:
    """Pure ASGI middleware adding INSTANCE_HEADER to every HTTP response, refusals included."""

    def __init__(self, app: Any, instance: str | None = None) -> None:
        self.app = app
        self.instance = instance or secrets.token_hex(8)  # random: it tells nothing else
        self._header = (INSTANCE_HEADER.encode(), self.instance.encode())

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_instance(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self._header]}
            await send(message)

        await self.app(scope, receive, send_with_instance)
