"""Who may use an inference server (`asyncrl infer`, any backend): only holders of its key,
which is `$<api_key_var>` where set, else the one the run's secret gives that variable
(`run_secret.server_key`: every server of `asyncrl rl`, loopback included, has one). A server
with neither (started by hand, no secret) is open to every process of this machine, and allowed
on a loopback `host` only: one whose `host` other machines reach refuses to start without a
key, as the environment server does (`envs/server.py`): its routes load weights, pause
generation and (vLLM) run worker methods, and none of that may be open to the network.

With a key, every route but /health, /version and /metrics needs it: asyncrl's own server
through `ApiKeyGuard`, vLLM through the same guard handed to it as `--middleware`
(`external_engine.py`), since vLLM's own key guards its `/v1` routes only.
"""

from __future__ import annotations

from collections.abc import Mapping

from asyncrl.config.base import ConfigError
from asyncrl.config.inference import InferenceConfig
from asyncrl.log import get_logger
from asyncrl.run_secret import RUN_SECRET_ENV, is_loopback, server_key

logger = get_logger(__name__)

# what anyone reaching an unguarded server could do, by backend
_OPEN_TO = {
    "embedded": "generate, pause it and reload its weights from `weight_roots`",
    "vllm": "generate and call vLLM's development routes (/collective_rpc runs any worker "
    "method, /pause, /sleep)",
    "sglang": "generate, pause it and reload its weights",
}


def server_api_key(config: InferenceConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The key the server requires (`run_secret.server_key`); without one, only a loopback
    `host` is allowed, and a `ConfigError` says why and what to do anywhere else."""
    key = server_key(config.api_key_var, environ)
    if key is None and not is_loopback(config.host):
        raise ConfigError(
            f"inference: `host` {config.host} serves other machines but ${config.api_key_var} "
            f"is unset (and no ${RUN_SECRET_ENV} to derive one from): anyone who reaches port "
            f"{config.port} could {_OPEN_TO[config.backend]}. Set a key there (clients send the "
            "one in their `api_key_var`; `asyncrl rl` keys every server itself), or serve on "
            "127.0.0.1"
        )
    return key


def log_access(config: InferenceConfig, key: str | None) -> None:
    """One line on who may use the server (loopback without a key: every local process)."""
    if key is None:
        logger.info(
            "inference: no API key ($%s and $%s unset): every process on this machine may use "
            "the server on %s:%d", config.api_key_var, RUN_SECRET_ENV, config.host, config.port,
        )  # fmt: skip
