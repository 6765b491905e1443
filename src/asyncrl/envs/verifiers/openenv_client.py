"""The one incompatibility between verifiers' OpenEnv adapter and `openenv-core` 0.3.0.

verifiers 0.4.0's `OpenEnvEnv.run` reads `client._base_url` of `openenv.GenericEnvClient` to
fetch the server's `/schema`. `openenv` >= 0.4.1 has that attribute; `openenv-core` 0.3.0 (the
release on the package index that installs beside verifiers here; `openenv` 0.10 needs a
`fastmcp` older than verifiers') keeps only `_ws_url`, the same server's WebSocket address, and
the episode fails with `AttributeError: 'GenericEnvClient' object has no attribute '_base_url'`.

`supply_base_url` gives openenv-core's client that attribute, derived from `_ws_url` (what the
newer client stores: the server's root, `ws://host:port`), in the worker that runs the
environment, and only where the installed client lacks it. Nothing else of either library is
changed.
"""

from __future__ import annotations

from pathlib import Path


def supply_base_url() -> bool:
    """Add `EnvClient._base_url` where openenv-core lacks it; True when it was added."""
    try:
        from openenv.core import env_client
    except ImportError:  # openenv is not installed: its adapter fails at start-up if used
        return False
    EnvClient = env_client.EnvClient
    source = Path(env_client.__file__ or "").read_text() if env_client.__file__ else ""
    if hasattr(EnvClient, "_base_url") or "_base_url" in source:
        return False  # a client that sets it itself (openenv >= 0.4.1)

    def base_url(client: env_client.EnvClient) -> str:
        return str(client._ws_url).removesuffix("/ws")

    EnvClient._base_url = property(base_url)  # type: ignore[attr-defined]
    return True
