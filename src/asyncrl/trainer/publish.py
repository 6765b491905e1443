"""Weights out to inference after a step: over NCCL/gloo to the servers, or as a broadcast
directory they load. With several ranks every rank helps gather the weights; rank 0 sends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from asyncrl.config.trainer import TrainerConfig
from asyncrl.log import get_logger
from asyncrl.trainer.parallel import Ranks, full_state_dict
from asyncrl.trainer.quantized_base import dequantized_base
from asyncrl.transport.broadcast import publish_marker, publish_weights
from asyncrl.transport.fingerprint import weights_fingerprint
from asyncrl.transport.nccl_broadcast import WeightSender
from asyncrl.transport.served_base import write_served_base
from asyncrl.types import TrainingBatch

logger = get_logger(__name__)

ADMIT_EVERY = 1.0  # seconds between looks for a restarted server while a batch is awaited


def open_sender(config: TrainerConfig) -> WeightSender | None:
    broadcast = config.weight_broadcast
    if broadcast.type != "nccl":
        return None
    return WeightSender(
        broadcast.host, broadcast.port, broadcast.inference_world_size, broadcast.timeout
    )


def publish(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    sender: WeightSender | None,
    keep: int,
    ranks: Ranks,
) -> None:
    """Weights version `step` out to inference: over NCCL/gloo, or as a checkpoint directory.
    With several ranks every rank takes part in gathering the weights; rank 0 publishes."""
    gathered = full_state_dict(model, ranks)
    if not ranks.is_main:
        return
    if sender is None:
        publish_weights(run_dir, step, model, keep=keep, state_dict=gathered)
        return
    sender.send(step, model)
    publish_marker(run_dir, step, weights_fingerprint(model.named_parameters()), keep=keep)


def publish_served_base(
    config: TrainerConfig, run_dir: Path, model: torch.nn.Module, ranks: Ranks
) -> None:
    """With `qlora_served_base: dequantized`: the quantized base, dequantized, for the servers
    to apply adapters to (once; kept when a restarted trainer finds the same weights there).
    Every rank takes part: under FSDP each weight is gathered in turn; rank 0 writes."""
    if config.qlora_served_base != "dequantized" or config.colocated_inference is not None:
        return  # a colocated engine takes the dequantized base in memory
    tensors = dequantized_base(model, keep=ranks.is_main)
    if not ranks.is_main:
        return
    base = write_served_base(run_dir, tensors, source=config.model)
    logger.info("trainer: the dequantized base is served from %s (fingerprint %s)",
                base.path, base.fingerprint)  # fmt: skip


def receive_admitting(
    receive: Callable[[float | None], TrainingBatch | None],
    sender: WeightSender | None,
    timeout: float | None,
) -> TrainingBatch | None:
    """`receive(timeout)`; with an NCCL sender, in slices between which a restarted server is
    let back into the weight group with the current weights: the batch awaited may be one only
    that server can generate."""
    if sender is None:
        return receive(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        sender.admit_restarted_servers()
        left = None if deadline is None else deadline - time.monotonic()
        try:
            return receive(ADMIT_EVERY if left is None else max(0.0, min(ADMIT_EVERY, left)))
        except TimeoutError:
            if left is not None and left <= ADMIT_EVERY:
                raise
