"""Weights out to inference after a step: over NCCL/gloo to the servers, or as a broadcast
directory they load. With several ranks every rank helps gather the weights; rank 0 sends.
"""

from __future__ import annotations

from pathlib import Path

import torch

from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.parallel import Ranks, full_state_dict
from asyncrl.transport.broadcast import publish_marker, publish_weights
from asyncrl.transport.fingerprint import weights_fingerprint
from asyncrl.transport.nccl_broadcast import WeightSender


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
