"""Weights out of the trainer, whatever carries them: every rank takes part in gathering the
whole model (FSDP), then rank 0 hands version s to its weight route
(`asyncrl.transport.weights`). Also, once per start, a QLoRA trainer's dequantized base for the
servers to apply adapters to.
"""

from __future__ import annotations

from pathlib import Path

import torch

from asyncrl.config.trainer import TrainerConfig
from asyncrl.log import get_logger
from asyncrl.trainer.parallel import Ranks, full_state_dict
from asyncrl.trainer.quantized_base import dequantized_base
from asyncrl.transport.served_base import write_served_base
from asyncrl.transport.weights.route import WeightRoute

logger = get_logger(__name__)


def publish_version(
    route: WeightRoute | None, step: int, model: torch.nn.Module, ranks: Ranks
) -> dict[str, float]:
    """Weights version `step` to the servers (every rank calls; `route` is rank 0's)."""
    state = full_state_dict(model, ranks)  # every rank takes part
    return route.publish(step, model, state) if route is not None else {}


def republish_version(
    route: WeightRoute | None, step: int, model: torch.nn.Module, ranks: Ranks
) -> bool:
    """A resumed trainer's weights, version `step`, to servers that may hold a withdrawn future
    (every rank calls; the route decides whether anything must go). True when they went."""
    state = full_state_dict(model, ranks)
    return route.republish(step, model, state) if route is not None else False


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
