"""ZMQ CURVE for the rollout transport: only the run's trainer can take the run's batches.

A PUSH socket deals its messages round-robin to every peer that connects, so on an open port a
stranger's PULL socket would take every other batch (token ids and task text) and the trainer
would stop at the gap. With the run's secret (`run_secret.py`) both ends derive two CURVE key
pairs from it: the orchestrator's socket is the CURVE server, and its ZAP handler admits one
client key, the trainer's. A peer without the secret cannot complete the handshake (it knows
neither key), so it never joins the round-robin; the traffic is encrypted as well.

Without a secret the transport must stay on loopback (`run_secret.secret_for` refuses
otherwise) and runs as plain TCP, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from asyncrl.run_secret import derive

ZAP_DOMAIN = "asyncrl-rollouts"


@dataclass(frozen=True)
class CurveKeys:
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def curve_keys(secret: str) -> CurveKeys:
    """Both key pairs (Z85), derived from the run's secret."""
    server_secret = z85.encode(derive(secret, "zmq-rollouts/server"))
    client_secret = z85.encode(derive(secret, "zmq-rollouts/client"))
    return CurveKeys(
        zmq.curve_public(server_secret), server_secret,
        zmq.curve_public(client_secret), client_secret,
    )  # fmt: skip


class _OnlyTheTrainer:
    """ZAP credentials: the one client key derived from the run's secret."""

    def __init__(self, client_public: bytes) -> None:
        self.client_public = client_public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.client_public


def serve_curve(
    context: zmq.Context[Any], socket: zmq.Socket[Any], secret: str
) -> ThreadAuthenticator:
    """Make `socket` (not yet bound) a CURVE server that admits only the trainer's key. Returns
    the authenticator thread, to `stop()` when the socket is closed."""
    keys = curve_keys(secret)
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve_callback(ZAP_DOMAIN, _OnlyTheTrainer(keys.client_public))
    socket.zap_domain = ZAP_DOMAIN.encode()
    socket.curve_secretkey = keys.server_secret
    socket.curve_publickey = keys.server_public
    socket.curve_server = True
    return authenticator


def connect_curve(socket: zmq.Socket[Any], secret: str) -> None:
    """Make `socket` (not yet connected) the trainer's CURVE client."""
    keys = curve_keys(secret)
    socket.curve_serverkey = keys.server_public
    socket.curve_secretkey = keys.client_secret
    socket.curve_publickey = keys.client_public
