"""The run's secret: what authenticates the channels a run opens between its own processes.

Torch's stores and ZMQ sockets have no user accounts, so a channel that anyone on the network
can reach is guarded by a secret that every role of the run holds and nobody else does. The
launchers (`asyncrl rl`, local or Ray) make a fresh one per run when `$ASYNCRL_RUN_SECRET` is
unset and hand it to every role in its environment; roles started by hand need the same value
in each. Every channel derives its own key from it (`derive`), so one channel's key says
nothing about another's, and the secret itself never crosses the network.

A channel bound to loopback works without a secret (only this machine reaches it); off
loopback a role without the secret refuses to start (`secret_for`), naming the channel.

No process that runs a user's code for the run (reward workers, tools, scorer plugins and
reward models) holds the secret, or any key the run uses: they start with
`user_code_environment`, the environment less every variable `withheld` names (the run's
secret, the inference and environment-server keys, Ray's token, and the `api_key_var`s the
config names, which the role adds with `withhold` before it starts any).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
from collections.abc import Mapping

from asyncrl.config.base import ConfigError

RUN_SECRET_ENV = "ASYNCRL_RUN_SECRET"
MIN_SECRET_CHARS = 16
# what no user code inherits, whatever the config: the run's secret, the default variables of
# the inference key (`api_key_var`) and of the env-server key, and Ray's cluster token (anyone
# holding it may run code on every node)
ALWAYS_WITHHELD = (RUN_SECRET_ENV, "VLLM_API_KEY", "ASYNCRL_ENV_API_KEY", "RAY_AUTH_TOKEN")
_withheld: set[str] = set(ALWAYS_WITHHELD)


def run_secret(environ: Mapping[str, str] | None = None) -> str | None:
    """The run's secret from the environment (None when unset or empty)."""
    value = (os.environ if environ is None else environ).get(RUN_SECRET_ENV) or None
    if value is not None and len(value) < MIN_SECRET_CHARS:
        raise ConfigError(
            f"${RUN_SECRET_ENV} has {len(value)} characters; use at least {MIN_SECRET_CHARS} "
            "random ones (`python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    return value


def new_run_secret() -> str:
    return secrets.token_urlsafe(32)


def is_loopback(host: str) -> bool:
    """True when `host` (an address or a name) only ever means this machine."""
    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:  # a name: loopback only if every address it resolves to is
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def secret_for(channel: str, host: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The run's secret for a channel bound to (or reached at) `host`: None on loopback without
    one; off loopback without one, a `ConfigError` that names the channel and the variable."""
    secret = run_secret(environ)
    if secret is None and not is_loopback(host):
        raise ConfigError(
            f"{channel} on {host} is reachable from other machines and has no authentication of "
            f"its own: set ${RUN_SECRET_ENV} to the same random value for every role of the run "
            "(`asyncrl rl` does this itself), or bind it to 127.0.0.1"
        )
    return secret


def derive(secret: str, channel: str) -> bytes:
    """32 bytes that only holders of `secret` can compute, different for every `channel`."""
    return hmac.new(secret.encode(), f"asyncrl/{channel}".encode(), hashlib.sha256).digest()


def store_prefix(secret: str | None, channel: str) -> str:
    """The key prefix of a torch store's entries: a client that does not know the secret cannot
    name (read, write, count up or wait on) any key the run uses."""
    if secret is None:
        return f"asyncrl/{channel}/"
    return f"asyncrl/{channel}/{derive(secret, channel).hex()}/"


def withhold(*variables: str | None) -> None:
    """Name further variables that hold a key of this process (a configured `api_key_var`):
    from now on no process started with `user_code_environment` inherits them."""
    _withheld.update(name for name in variables if name)


def withheld() -> frozenset[str]:
    return frozenset(_withheld)


def user_code_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process that runs a user's code (a reward, a tool, a scorer): this
    one's (`environ`) less the run's secret and every key `withheld` names."""
    source = os.environ if environ is None else environ
    return {name: value for name, value in source.items() if name not in _withheld}
