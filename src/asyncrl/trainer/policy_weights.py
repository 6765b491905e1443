"""The policy's weights as an inference engine holds them, for a colocated engine synced in
memory: Hugging Face parameter names, LoRA adapters merged into the weights they adapt.
"""

from __future__ import annotations

import torch

from asyncrl.trainer.quantized_base import (
    dequantized_base,
    dequantized_weight,
    is_quantized,
    is_quantized_layer,
)

PEFT_PREFIX = "base_model.model."


def policy_tensors(model: torch.nn.Module, complete: bool = False) -> dict[str, torch.Tensor]:
    """What a server must hold to serve `model`: every parameter by name, or for a PEFT model
    only the adapted weights, merged as W + scale·B·A (the rest of the base never changes);
    with `complete`, the base's other weights too (vLLM reloads a model whole). A quantized
    base (QLoRA) is dequantized: W is what the trainer's forward multiplies by."""
    if not hasattr(model, "peft_config"):
        return {name: parameter.detach() for name, parameter in model.named_parameters()}
    if complete and is_quantized(model):
        return dequantized_base(model) | policy_tensors(model)
    if complete:
        base = {
            name.removeprefix(PEFT_PREFIX).replace(".base_layer.", "."): parameter.detach()
            for name, parameter in model.named_parameters()
            if ".lora_" not in name
        }
        return base | policy_tensors(model)
    from peft.tuners.lora import LoraLayer

    merged: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for module_path, module in model.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            adapters = [name for name in module.active_adapters if name in module.lora_A]
            if not adapters:
                continue
            base_layer = module.get_base_layer()
            quantized = is_quantized_layer(base_layer)
            weight = dequantized_weight(base_layer) if quantized else base_layer.weight
            delta = sum(module.get_delta_weight(name) for name in adapters)
            name = f"{module_path.removeprefix(PEFT_PREFIX)}.weight"
            merged[name] = (weight + delta.to(weight.dtype)).detach()
    return merged


def share_storage(engine_model: torch.nn.Module, model: torch.nn.Module) -> int:
    """Make the engine's parameters the trainer's own tensors where name, shape, dtype and
    device agree (full fine-tuning in the serving dtype): one copy of the weights in memory,
    and nothing to copy after a step. Returns how many parameters are shared."""
    if hasattr(model, "peft_config"):
        return 0  # the engine holds merged weights, which the trainer does not have
    trained = dict(model.named_parameters())
    shared = 0
    for name, parameter in engine_model.named_parameters():
        source = trained.get(name)
        if source is None or (source.shape, source.dtype, source.device) != (
            parameter.shape, parameter.dtype, parameter.device,
        ):  # fmt: skip
            continue
        parameter.data = source.data
        shared += 1
    return shared


def check_names(tensors: dict[str, torch.Tensor], engine_model: torch.nn.Module) -> None:
    """Every tensor the trainer hands over must be an engine parameter of the same shape."""
    parameters = dict(engine_model.named_parameters())
    for name, tensor in tensors.items():
        if name not in parameters:
            raise ValueError(f"the trainer's `{name}` is not a parameter of the served model")
        if parameters[name].shape != tensor.shape:
            raise ValueError(
                f"`{name}`: the trainer holds {tuple(tensor.shape)}, the served model "
                f"{tuple(parameters[name].shape)}"
            )
