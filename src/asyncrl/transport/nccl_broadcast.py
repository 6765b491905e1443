"""Weight broadcast over torch.distributed: NCCL on GPUs, gloo on CPU (so it runs in tests here).

The trainer is rank 0 and hosts the rendezvous store; each inference server is one more rank.
For every step the trainer first sets the store key `weights_<step>`, then broadcasts a header
(step, tensor count) and every parameter in `named_parameters()` order — the receivers hold the
same architecture, so order and shapes agree. Receivers wait for that key in short polls, so a
long training step is never mistaken for a dead peer; the transfer itself is bounded by
`timeout` and raises instead of hanging.

Full weights only: a LoRA policy broadcasts its adapter through the filesystem.

The store has no authentication, so it listens on the configured host only (torch's own server
would listen on every interface): loopback by default, the trainer's address on a cluster,
where the network between nodes must be trusted.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from asyncrl.log import get_logger

logger = get_logger(__name__)


def _backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def join_group(
    host: str, port: int, rank: int, world_size: int, timeout: float, listener: socket.socket | None
) -> dist.TCPStore:
    """Join the weight group (rank 0 hosts the store on `listener`); returns the store for
    step signalling."""
    store = dist.TCPStore(
        host, port, world_size, is_master=rank == 0, timeout=timedelta(seconds=timeout),
        master_listen_fd=listener.fileno() if listener else None,
    )  # fmt: skip
    dist.init_process_group(
        _backend(), store=store, rank=rank, world_size=world_size,
        timeout=timedelta(seconds=timeout),
    )  # fmt: skip
    return store


class WeightSender:
    """Rank 0: the trainer."""

    def __init__(self, host: str, port: int, receivers: int, timeout: float) -> None:
        logger.info(
            "weight broadcast: waiting for %d inference rank(s) on %s:%d", receivers, host, port
        )
        self.listener = socket.create_server((host, port))  # `host` only; open while we serve
        self.store = join_group(host, port, 0, receivers + 1, timeout, self.listener)
        self.device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

    @torch.no_grad()
    def send(self, step: int, model: torch.nn.Module) -> None:
        if hasattr(model, "peft_config"):
            raise ValueError(
                "NCCL broadcast sends full weights; use filesystem broadcast with LoRA"
            )
        parameters = list(model.named_parameters())
        self.store.set(f"weights_{step}", str(len(parameters)))
        header = torch.tensor([step, len(parameters)], dtype=torch.int64, device=self.device)
        dist.broadcast(header, src=0)
        for _, parameter in parameters:
            dist.broadcast(parameter.detach().to(self.device).contiguous(), src=0)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class WeightReceiver:
    """Rank >= 1: an inference server. `receive` blocks until the trainer sends a step."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout: float) -> None:
        self.store = join_group(host, port, rank, world_size, timeout, listener=None)
        self.next_step = 1

    @torch.no_grad()
    def receive(
        self, model: torch.nn.Module, should_stop: Callable[[], bool], poll: float = 1.0
    ) -> tuple[int, dict[str, torch.Tensor]] | None:
        """Staging copies of the next step's tensors (None if told to stop while waiting)."""
        while True:
            if should_stop():
                return None
            try:
                self.store.wait([f"weights_{self.next_step}"], timedelta(seconds=poll))
                break
            except RuntimeError:  # the key is not there yet: poll again
                continue
        device = next(model.parameters()).device  # NCCL needs GPU tensors, gloo CPU ones
        header = torch.zeros(2, dtype=torch.int64, device=device)
        dist.broadcast(header, src=0)
        step, count = (int(v) for v in header)
        parameters = list(model.named_parameters())
        if count != len(parameters):
            raise RuntimeError(f"trainer sends {count} tensors, this model has {len(parameters)}")
        staged = {}
        for name, parameter in parameters:
            buffer = torch.empty_like(parameter)
            dist.broadcast(buffer, src=0)
            staged[name] = buffer
        self.next_step = step + 1
        return step, staged

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
