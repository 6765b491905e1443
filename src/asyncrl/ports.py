"""Ports a role will bind a moment later (and again after a restart), chosen so that nothing
else is handed them in between.

The usual trick, bind port 0 and close, returns a port from the kernel's ephemeral range: the
very range it hands to every outgoing connection and every other bind(0). Closed again, the
port may go to the next connection this node opens before the role binds it, or while the role
is down for a restart, and the role then fails to start. So ports are chosen below that range
(`ip_local_port_range`), where the kernel never hands out a port by itself, and above the ports a
Ray node gives its workers (`ray start`'s default `--min-worker-port` 10002 to
`--max-worker-port` 19999: a worker may bind any of them at any moment, and `ray start` refuses
a `--port` among them); each is checked free by binding it; all are held until every one is
found, so they are distinct.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20_000  # below: well-known services, then Ray's worker ports (10002-19999)
RAY_WORKER_PORTS = range(10_002, 20_000)
DEFAULT_EPHEMERAL = (32_768, 60_999)  # Linux's default range, where /proc does not say


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out by itself, from /proc (Linux) or its default."""
    try:
        first, last = (int(value) for value in PORT_RANGE.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return first, last


def free_ports(count: int, host: str = "") -> list[int]:
    """`count` distinct ports free on `host` now ("" = every address), from below the
    ephemeral range; from anywhere (bind 0) when that range leaves no room below it."""
    first, _ = ephemeral_range()
    candidates = list(range(LOWEST, first))
    random.shuffle(candidates)
    held: list[socket.socket] = []
    try:
        for port in candidates:
            if len(held) == count:
                break
            sock = socket.socket()
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
        while len(held) < count:  # no room below the ephemeral range
            sock = socket.socket()
            sock.bind((host, 0))
            held.append(sock)
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()
