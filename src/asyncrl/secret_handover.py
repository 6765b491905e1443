"""Keys handed to a child process over a private socket, never through its environment.

A process's environment stays readable in `/proc/<pid>/environ` for as long as it lives,
whatever it later removes from `os.environ`, and every program it starts inherits it. So a
process that starts a role (the launchers, a trainer starting its ranks, `asyncrl infer`
starting vLLM) hands it its keys through one end of a socket pair the child inherits: the keys
are written before the child starts, the child finds the descriptor's number in
`$ASYNCRL_SECRETS_FD`, reads them (JSON), closes it, and holds them in memory
(`run_secret.adopt`), after it has marked itself not dumpable (`process_privacy.py`). A socket,
not a pipe: another process may open a pipe through `/proc/<pid>/fd/<n>`, never a socket.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping

from asyncrl.process_privacy import make_unreadable
from asyncrl.run_secret import adopt

SECRETS_FD_ENV = "ASYNCRL_SECRETS_FD"
MOST_BYTES = 16384  # written before the child runs: never more than a socket buffer holds


class Handover:
    """The child's end of a socket holding `keys`: pass `descriptor` to the child (`pass_fds`)
    with `environment` in its environment, then `close()` this process's copy."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        data = json.dumps(dict(keys)).encode()
        if len(data) > MOST_BYTES:
            raise ValueError(f"{len(data)} bytes of keys to hand over; at most {MOST_BYTES}")
        ours, theirs = socket.socketpair()
        try:
            ours.sendall(data)
        finally:
            ours.close()  # the child reads to the end
        self._socket = theirs
        self.descriptor = theirs.fileno()
        self.environment = {SECRETS_FD_ENV: str(self.descriptor)}

    def close(self) -> None:
        self._socket.close()


def receive_keys(environ: dict[str, str] | None = None) -> dict[str, str]:
    """In a child started with a `Handover`: this process made not dumpable, the keys read and
    held (`run_secret.adopt`), the descriptor closed and its variable removed. Returns them
    ({} when this process was handed none)."""
    environ = os.environ if environ is None else environ  # type: ignore[assignment]
    number = environ.pop(SECRETS_FD_ENV, None)
    if number is None:
        return {}
    make_unreadable()  # before a key is in this process's memory
    received = socket.socket(fileno=int(number))
    chunks = []
    try:
        while chunk := received.recv(65536):
            chunks.append(chunk)
    finally:
        received.close()
    if not chunks:  # a `Handover` always writes an object: someone else read it first
        raise RuntimeError(f"the keys handed over on descriptor {number} were empty")
    keys = json.loads(b"".join(chunks))
    if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
        raise RuntimeError(f"the keys handed over on descriptor {number} are not a JSON object")
    adopt(keys)
    return keys
