"""The dtype an inference engine serves in: `dtype: auto` resolved on this machine.

The embedded engine loads weights in it. External engines get it on CPU machines, where their
own `auto` may pick bfloat16 for a float32 checkpoint (vLLM-CPU does) even on a CPU that runs
bfloat16 ~100× slower; on GPUs their own choice stands.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig

from asyncrl.config.inference import InferenceConfig
from asyncrl.log import get_logger
from asyncrl.precision import choose_inference_dtype, default_device, describe_device

logger = get_logger(__name__)

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def serving_dtype(config: InferenceConfig) -> torch.dtype:
    """`dtype: auto` keeps the checkpoint's dtype unless this device runs it slowly."""
    if config.dtype == "float32":
        return torch.float32  # nothing to decide: skip the probe
    stored = AutoConfig.from_pretrained(
        config.model, trust_remote_code=config.trust_remote_code
    ).dtype
    checkpoint_dtype = getattr(torch, stored) if isinstance(stored, str) else stored
    device = describe_device(default_device())
    dtype, reason = choose_inference_dtype(config.dtype, checkpoint_dtype, device)
    logger.info("inference: weights in %s (%s)", dtype, reason)
    return dtype


def external_engine_dtype(config: InferenceConfig) -> str:
    """The `--dtype` to give vLLM or SGLang: ours on a CPU machine with `auto`, else as set."""
    if config.dtype != "auto" or torch.cuda.is_available():
        return config.dtype
    return DTYPE_NAMES[serving_dtype(config)]
