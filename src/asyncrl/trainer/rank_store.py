"""The store through which the trainer's ranks find each other: bound to the address they
reach it at, its keys under the run's secret.

torch's `env://` rendezvous makes rank 0 host a TCPStore that listens on every interface, with
no authentication: any machine could reach it, claim a rank or read the ranks' addresses. Here
rank 0 binds the store to `MASTER_ADDR` only (127.0.0.1 when `asyncrl train` starts the ranks
itself; the node's address on a cluster, where the other ranks are), and every key of the
process group lives under a prefix derived from the run's secret (`run_secret.py`): a client
without it cannot name a key the ranks use. Off loopback a rank without the secret refuses
to start.

Ranks started by torchrun (several nodes, run by hand) find the store torchrun's agent hosts
instead; that one is torchrun's (it listens where torchrun puts it), and the prefix still
keeps the process group's keys to holders of the secret.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch.distributed as dist

from asyncrl.run_secret import secret_for, store_prefix

CHANNEL = "the trainer ranks' rendezvous store (MASTER_ADDR)"


def rank_store(rank: int, world_size: int, timeout: float) -> dist.Store:
    """This rank's view of the ranks' store, from MASTER_ADDR / MASTER_PORT."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    prefix = store_prefix(secret_for(CHANNEL, host), "trainer-ranks")
    wait = timedelta(seconds=timeout)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun hosts it
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        agent = dist.TCPStore(host, port, world_size, is_master=False, timeout=wait)
        return dist.PrefixStore(f"/worker/attempt_{attempt}/{prefix}", agent)
    if rank != 0:
        client = dist.TCPStore(host, port, world_size, is_master=False, timeout=wait)
        return dist.PrefixStore(prefix, client)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host.strip("[]"), port), family=family)
    server = dist.TCPStore(
        host, port, world_size, is_master=True, timeout=wait,
        wait_for_workers=False, master_listen_fd=listener.fileno(),
    )  # fmt: skip
    listener.detach()  # the store owns the socket now, and closes it with itself
    return dist.PrefixStore(prefix, server)
