"""The run's secret: what authenticates the channels a run opens between its own processes.

Torch's stores and ZMQ sockets have no user accounts, so a channel that anyone on the network
can reach is guarded by a secret that every role of the run holds and nobody else does. The
launchers (`asyncrl rl`, local or Ray) make a fresh one per run when `$ASYNCRL_RUN_SECRET` is
unset and hand it to every role (in memory or over a socket, never in its environment: below);
roles started by hand need the same value in each. Every channel derives its own key from it
(`derive`), so one channel's key says nothing about another's, and the secret itself never
crosses the network.

The HTTP servers of a run (inference, judge, env-server) take a bearer key: the value of
their `api_key_var` where the user set one, else one derived from the run's secret for that
variable (`server_key`), which every role of the run computes alike, so a run's servers are
never open, loopback included, and no key travels beside the secret.

A channel bound to loopback works without a secret (only this machine reaches it); off
loopback a role without the secret refuses to start (`secret_for`), naming the channel.

Keys live in this process's memory, not its environment (`hold`): a role is handed them over
a private socket (`secret_handover.py`), and a variable the user exported is moved out of
`os.environ` before any child starts, so no program a role starts inherits one by accident.
No process that runs a user's code for the run (reward workers, tools, scorer plugins and
reward models) holds the secret or any key: they start with `user_code.py`'s environment, an
allowlist that never passes a variable `withheld` names (the run's secret, the inference and
environment-server keys, Ray's token, and the `api_key_var`s the config names, which the role
adds with `withhold` before it starts any).
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
# withheld from user code but left in the environment: Ray reads its token from there itself
LEFT_IN_ENVIRONMENT = frozenset({"RAY_AUTH_TOKEN"})
_held: dict[str, str] = {}  # keys this process holds in memory, out of its environment


def key_of(variable: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of a key variable: from `environ` when given, else this process's environment
    or the keys it holds (`hold`, `adopt`); None when unset or empty."""
    if environ is not None:
        return environ.get(variable) or None
    return os.environ.get(variable) or _held.get(variable) or None


def hold(*variables: str) -> None:
    """Move these variables out of `os.environ` into this process's memory: `key_of` still
    finds them, no child started from here on inherits them."""
    for name in variables:
        value = os.environ.pop(name, None)
        if value:
            _held[name] = value


def adopt(keys: Mapping[str, str], only: bool = False) -> None:
    """Hold keys handed over by the process that started this one (`secret_handover.py`);
    `only`: these and no others (a role forked from a launcher that held more)."""
    if only:
        _held.clear()
    _held.update({name: value for name, value in keys.items() if value})


def held_keys() -> dict[str, str]:
    """Every key this process holds in memory: what it hands a copy of itself (a trainer rank)."""
    return dict(_held)


def keys_for(*variables: str | None) -> dict[str, str]:
    """{variable: value} of those of `variables` this process has a value for: what it hands a
    role it starts (never through that role's environment)."""
    return {name: value for name in dict.fromkeys(variables) if name and (value := key_of(name))}


def run_secret(environ: Mapping[str, str] | None = None) -> str | None:
    """The run's secret (None when unset or empty), from `environ` when given, else from this
    process's environment or the keys it holds."""
    value = key_of(RUN_SECRET_ENV, environ)
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


def server_key(variable: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer key of a server whose clients and server name `variable` (`api_key_var`):
    the value set there, else one derived from the run's secret for that variable (every holder
    of the secret computes the same, so a run's servers and clients agree without handing a key
    around), else None (no secret: the server is open, and allowed on loopback only)."""
    chosen = key_of(variable, environ)
    if chosen is not None:
        return chosen
    secret = run_secret(environ)
    return None if secret is None else derive(secret, f"bearer/{variable}").hex()


def store_prefix(secret: str | None, channel: str) -> str:
    """The key prefix of a torch store's entries: a client that does not know the secret cannot
    name (read, write, count up or wait on) any key the run uses."""
    if secret is None:
        return f"asyncrl/{channel}/"
    return f"asyncrl/{channel}/{derive(secret, channel).hex()}/"


def withhold(*variables: str | None) -> None:
    """Name further variables that hold a key of this process (a configured `api_key_var`):
    from now on no process that runs a user's code is given them, and every key this process
    has (these and `ALWAYS_WITHHELD`) is moved out of its environment (`hold`)."""
    _withheld.update(name for name in variables if name)
    hold(*(_withheld - LEFT_IN_ENVIRONMENT))


def withheld() -> frozenset[str]:
    return frozenset(_withheld)
