"""The dtype the servers serve in, as the trainer sees it: its per-tensor checksums and its
deltas are made at that precision, so a server checks the very values it serves.

`weight_broadcast.served_dtype` (`asyncrl rl` copies `inference.dtype` there; a colocated
trainer reads its engine's) is resolved here as a server resolves `dtype: auto` on this
machine (`precision.choose_inference_dtype`). A wrong guess costs speed, never correctness: a
server serving another dtype checks what it read against the trainer's own checksums, then its
cast of them, and loads full versions instead of deltas.
"""

from __future__ import annotations

import torch

from asyncrl.config.trainer import TrainerConfig
from asyncrl.log import get_logger
from asyncrl.precision import choose_inference_dtype, default_device, describe_device

logger = get_logger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def served_dtype(config: TrainerConfig) -> torch.dtype:
    requested = config.weight_broadcast.served_dtype
    if config.colocated_inference is not None:
        requested = config.colocated_inference.dtype
    if requested != "auto":
        return DTYPES[requested]
    from transformers import AutoConfig

    stored = AutoConfig.from_pretrained(
        config.model, trust_remote_code=config.trust_remote_code
    ).dtype
    checkpoint_dtype = getattr(torch, stored) if isinstance(stored, str) else stored
    dtype, reason = choose_inference_dtype(
        "auto", checkpoint_dtype, describe_device(default_device())
    )
    logger.info("weights: checksums and deltas at the servers' %s (%s)", dtype, reason)
    return dtype
