"""QLoRA: the frozen base stored quantized under the LoRA adapters.

- `qlora_bnb`, NF4 (bitsandbytes), the QLoRA paper's recipe: every Linear of the decoder
  (not the LM head) holds 4-bit NormalFloat codes in blocks of 64 weights that share an absmax,
  and the absmaxes are quantized again to 8 bits in blocks of 256 (double quantization).
  A forward dequantizes each weight to the compute dtype — the recipe's: float32 under `fp32`,
  bfloat16 under `bf16` — and multiplies; backward multiplies by the same dequantized weight, so
  gradients reach the adapters beneath through the 4-bit base. The adapters are float32 in either
  recipe (under `bf16` they compute in autocast, like plain LoRA); embeddings and norms keep the
  recipe's base dtype. Runs wherever bitsandbytes does, this project's CPUs included.
- `qlora_fp8`: transformers' fine-grained FP8 (e4m3 weights, one scale per 128×128 block);
  its layers have a backward through the dequantized weight. FP8 matmuls need compute
  capability ≥ 8.9; anywhere else this refuses to start rather than run something else.
- `qlora_fp4`: NVFP4 needs compute capability ≥ 10.0, and transformers' NVFP4 layers have no
  backward (their quantizer says so: not trainable), so this refuses on every device; the
  message names the device's capability.

The GPU paths (FP8, and NF4 on CUDA) are written for GPU machines and not run by this
project's CPU-only tests.

What inference serves: the adapter applies to the servers' own full-precision base (the trainer's
logprobs then differ from the servers' by the quantization error, which `trainer/mismatch_kl`
shows) or, with `qlora_served_base: dequantized`, to `dequantized_base(model)`, which the
trainer publishes once (`transport/served_base.py`): the same weights the trainer multiplies by.
"""

from __future__ import annotations

from typing import Any

import torch

from asyncrl.bitsandbytes_import import quiet_bitsandbytes_import
from asyncrl.config.base import ConfigError
from asyncrl.config.training import TrainingConfig
from asyncrl.log import get_logger

logger = get_logger(__name__)

PEFT_PREFIX = "base_model.model."
NF4_BLOCK = 64  # weights per absmax: the QLoRA paper's block size, bitsandbytes' default
FP8_BLOCK = (128, 128)
FP8_CAPABILITY = (8, 9)  # Ada / Hopper and later: FP8 tensor cores
FP4_CAPABILITY = (10, 0)  # Blackwell: block-scaled FP4 tensor cores


def compute_capability(device: torch.device) -> tuple[int, int] | None:
    """The CUDA compute capability of `device`, None for a device that has none (a CPU)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


def describe_device(device: torch.device) -> str:
    capability = compute_capability(device)
    if capability is None:
        return f"this trainer's device is `{device.type}`, which has no CUDA compute capability"
    name = torch.cuda.get_device_name(device)
    return f"this trainer's device is {name}, compute capability {capability[0]}.{capability[1]}"


def base_quantization(
    config: TrainingConfig, base_dtype: torch.dtype, device: torch.device
) -> Any | None:
    """The transformers quantization config that loads the base as the QLoRA key asks, or None
    without QLoRA. Raises ConfigError, naming the device's compute capability, where the format
    cannot run (refused, never silently replaced by another format)."""
    if config.qlora_bnb:
        _need_bitsandbytes()
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=base_dtype,
        )
    if config.qlora_fp8:
        capability = compute_capability(device)
        if capability is None or capability < FP8_CAPABILITY:
            raise ConfigError(
                "`qlora_fp8` needs FP8 matmuls, on a CUDA GPU of compute capability ≥ 8.9 "
                f"(Ada, Hopper, Blackwell); {describe_device(device)}. `qlora_bnb` (NF4) runs on "
                "any device"
            )
        from transformers import FineGrainedFP8Config

        return FineGrainedFP8Config(weight_block_size=FP8_BLOCK)
    if config.qlora_fp4:
        capability = compute_capability(device)
        if capability is None or capability < FP4_CAPABILITY:
            raise ConfigError(
                "`qlora_fp4` needs NVFP4 matmuls, on a CUDA GPU of compute capability ≥ 10.0 "
                f"(Blackwell); {describe_device(device)}. `qlora_bnb` (NF4) runs on any device"
            )
        raise ConfigError(
            "`qlora_fp4`: transformers' NVFP4 layers have no backward (its NVFP4 quantizer is "
            "not trainable), so gradients cannot reach LoRA adapters through an NVFP4 base; use "
            "`qlora_fp8` or `qlora_bnb`"
        )
    return None


def _need_bitsandbytes() -> None:
    try:
        with quiet_bitsandbytes_import():  # its hub-kernel warning: not a path asyncrl takes
            import bitsandbytes  # noqa: F401
    except ImportError as error:
        raise ConfigError(
            "`qlora_bnb` needs bitsandbytes: `pip install 'asyncrl[qlora]'` (its wheel runs NF4 "
            "on CPUs and CUDA GPUs)"
        ) from error


def loading_arguments(quantization: Any | None, device: torch.device) -> dict[str, Any]:
    """`from_pretrained` keywords: a quantized base is quantized while it is loaded onto its
    device, so it needs the device up front."""
    if quantization is None:
        return {}
    target = torch.cuda.current_device() if device.type == "cuda" else device.type
    return {"quantization_config": quantization, "device_map": {"": target}}


def prepare_quantized_base(model: torch.nn.Module) -> None:
    """Keep every 4-bit layer on the exact path: on a CPU with AVX512-BF16, bitsandbytes
    repacks a layer's weight for a bfloat16 kernel the first time it runs in eval mode without
    gradients — in place, for good, and off by up to 5e-3 in the logprobs from the float32
    product. Training never wants that, and the repacked weight no longer dequantizes."""
    for module in quantized_layers(model).values():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    logger.info(
        "QLoRA: %d quantized layers; the base holds %.2f MB (%.2f MB in float32)",
        len(quantized_layers(model)), base_bytes(model) / 1e6, dense_base_bytes(model) / 1e6,
    )  # fmt: skip


def quantized_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Module path -> layer, for every layer whose weight is stored quantized."""
    return {name: module for name, module in model.named_modules() if is_quantized_layer(module)}


def is_quantized(model: torch.nn.Module) -> bool:
    return any(is_quantized_layer(module) for module in model.modules())


def is_quantized_layer(module: torch.nn.Module) -> bool:
    """A bitsandbytes 4-bit Linear or a transformers FP8 Linear (never PEFT's wrapper around
    one). Told by class, not by the weight's type: FSDP swaps the parameter for its own."""
    return any(
        (cls.__module__.startswith("bitsandbytes") and cls.__name__ == "Linear4bit")
        or (cls.__module__.startswith("transformers") and cls.__name__ == "FP8Linear")
        for cls in type(module).__mro__
    )


def _is_nf4(module: torch.nn.Module) -> bool:
    return hasattr(module, "quant_state") or type(module.weight).__name__ == "Params4bit"


def dequantized_weight(module: torch.nn.Module) -> torch.Tensor:
    """The dense weight a quantized layer multiplies by, `[out_features, in_features]`, in the
    dtype its forward computes in. Under FSDP every rank must call this (it gathers)."""
    weight = _full(module.weight)
    if _is_nf4(module):
        import bitsandbytes.functional as bnb_functional

        state = _quant_state(module)
        return bnb_functional.dequantize_4bit(weight, state).to(_compute_dtype(module, state))
    return _dequantize_fp8(weight, _full(module.weight_scale_inv), module.block_size)


def _quant_state(module: torch.nn.Module) -> Any:
    """A 4-bit layer's quantization state; bitsandbytes keeps a copy on the module for when
    FSDP has replaced the parameter that carried it."""
    state = getattr(module.weight, "quant_state", None)
    return state if state is not None else module.quant_state


def _compute_dtype(module: torch.nn.Module, state: Any) -> torch.dtype:
    return getattr(module, "compute_dtype", None) or state.dtype


def _dequantize_fp8(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] | None
) -> torch.Tensor:
    """e4m3 codes × their block's scale (one scale per tensor when `block` is None)."""
    dense = weight.to(torch.float32)
    if block is None:
        return (dense * scale_inv.float()).to(torch.bfloat16)
    rows, cols = dense.shape
    scale = scale_inv.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return (dense * scale[:rows, :cols]).to(torch.bfloat16)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a parameter FSDP shards (a collective), else the tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.data


def dequantized_base(model: torch.nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
    """The base as a dense Hugging Face state dict (LoRA adapters left out, PEFT's prefixes
    taken off): every quantized weight dequantized exactly as the trainer's forward does, every
    other base parameter as it is. A tied LM head appears once, as the embedding. Under FSDP
    every rank calls this (each weight is gathered in turn); those with `keep` False get {}."""
    layers = quantized_layers(model)
    tensors: dict[str, torch.Tensor] = {}
    for name, parameter in model.named_parameters():
        if ".lora_" in name:
            continue
        module_path, _, leaf = name.rpartition(".")
        if module_path in layers:
            if leaf != "weight":
                continue  # FP8 scales are part of the weight below
            tensor = dequantized_weight(layers[module_path])
        else:
            tensor = _full(parameter)
        if keep:
            key = name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
            tensors[key] = tensor.detach().to("cpu").contiguous()
    return tensors


def base_bytes(model: torch.nn.Module) -> int:
    """Bytes the frozen base takes as stored: quantized codes with their scales (and the nested
    scales and code tables of double quantization), plus every other frozen parameter."""
    total = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    for module in quantized_layers(model).values():
        state = _quant_state(module) if _is_nf4(module) else None
        if state is None:
            continue
        extra = [state.absmax, state.code]
        if state.nested:
            extra += [state.state2.absmax, state.state2.code]
        total += sum(t.numel() * t.element_size() for t in extra)
    return total


def dense_base_bytes(model: torch.nn.Module) -> int:
    """Bytes the same frozen base takes in float32."""
    total = 0
    layers = quantized_layers(model)
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            continue
        module_path = name.rpartition(".")[0]
        if module_path in layers:
            module = layers[module_path]
            if name.endswith(".weight"):
                total += module.in_features * module.out_features * 4
            continue
        total += parameter.numel() * 4
    return total
