"""Reading weights into a running model: full Hugging Face checkpoints and PEFT LoRA adapters.

Only directories under the configured roots are read: an HTTP client cannot make the server open
arbitrary files. Adapters are merged into the weights (W + scale · B·A) on top of a kept copy
of the base weights, so loading an adapter in place never stacks on the previous one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file


class WeightLoadError(ValueError):
    """The directory is missing, outside the allowed roots, or does not fit the model."""


def resolve_under_roots(path: str, roots: list[str]) -> Path:
    """The real path of `path`, which must lie under one of `roots` (symlinks resolved)."""
    resolved = Path(path).expanduser().resolve()
    for root in roots:
        root_path = Path(root).expanduser().resolve()
        if resolved == root_path or root_path in resolved.parents:
            if not resolved.is_dir():
                raise WeightLoadError(f"{path}: not a directory")
            return resolved
    raise WeightLoadError(
        f"{path}: outside the allowed weight roots {roots} (set inference.weight_roots)"
    )


def read_safetensors_dir(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of `model.safetensors`, or of the shards its index names."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        shard_names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [directory / name for name in shard_names]
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"{directory}: no .safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(file))
        except (SafetensorError, OSError) as error:
            raise WeightLoadError(f"{file}: cannot read safetensors ({error})") from error
    return tensors


def load_full_weights(model: torch.nn.Module, directory: Path) -> None:
    """Copy a checkpoint's tensors into the model in place; every parameter must be covered."""
    tensors = read_safetensors_dir(directory)
    parameters = dict(model.named_parameters())
    missing = [name for name in parameters if name not in tensors and not _is_tied(model, name)]
    unknown = [name for name in tensors if name not in parameters]
    if missing or unknown:
        raise WeightLoadError(
            f"{directory}: does not fit the model (missing {missing[:3]}, unknown {unknown[:3]})"
        )
    mismatched = [
        f"`{name}` {tuple(tensor.shape)} vs model {tuple(parameters[name].shape)}"
        for name, tensor in tensors.items()
        if parameters[name].shape != tensor.shape
    ]
    if mismatched:  # checked before copying anything: a refused update changes nothing
        raise WeightLoadError(f"{directory}: shape mismatch: {'; '.join(mismatched[:3])}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            parameters[name].copy_(tensor.to(parameters[name].dtype))


def _is_tied(model: torch.nn.Module, name: str) -> bool:
    return name == "lm_head.weight" and bool(getattr(model.config, "tie_word_embeddings", False))


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    path: Path
    rank: int
    deltas: dict[str, torch.Tensor]  # model parameter name -> scale · B·A


def read_lora_adapter(name: str, directory: Path, model: torch.nn.Module) -> LoraAdapter:
    """Read a PEFT adapter directory into per-weight deltas for this model."""
    config_file = directory / "adapter_config.json"
    if not config_file.exists():
        raise WeightLoadError(f"{directory}: no adapter_config.json (not a PEFT adapter)")
    config = json.loads(config_file.read_text())
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha", rank))
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    tensors = read_safetensors_dir(directory)
    parameters = dict(model.named_parameters())
    deltas: dict[str, torch.Tensor] = {}
    for key, lora_a in tensors.items():
        if ".lora_A." not in key:
            continue
        lora_b = tensors.get(key.replace(".lora_A.", ".lora_B."))
        if lora_b is None:
            raise WeightLoadError(f"{directory}: `{key}` has no matching lora_B")
        target = _target_parameter(key.split(".lora_A.")[0])
        if target not in parameters:
            raise WeightLoadError(f"{directory}: adapter targets `{target}`, not in the model")
        deltas[target] = scale * (lora_b.float() @ lora_a.float())
    if not deltas:
        raise WeightLoadError(f"{directory}: adapter holds no LoRA weights")
    return LoraAdapter(name=name, path=directory, rank=rank, deltas=deltas)


def _target_parameter(module_path: str) -> str:
    """`base_model.model.<module path>` (PEFT's naming) -> `<module path>.weight`."""
    return f"{module_path.removeprefix('base_model.model.')}.weight"


def apply_lora(
    model: torch.nn.Module, base_weights: dict[str, torch.Tensor], adapter: LoraAdapter | None
) -> None:
    """Set every adapted weight to base + delta (or back to base when `adapter` is None)."""
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, base in base_weights.items():
            parameters[name].copy_(base)
        if adapter is not None:
            for name, delta in adapter.deltas.items():
                parameters[name].add_(delta.to(parameters[name].dtype))
