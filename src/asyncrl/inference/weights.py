"""Reading weights into a running model: full Hugging Face checkpoints and PEFT LoRA adapters.

Only files under the configured roots are read: every file is resolved (symlinks, `..` in a
shard index) and checked before it is opened, so an HTTP client cannot make the server open
arbitrary files. An update is checked whole before any weight changes: a refused one leaves the
served weights exactly as they were. Adapters are merged into the weights (W + scale · B·A) on
top of a kept copy of the base weights, so loading an adapter in place never stacks on the
previous one.

An adapter is kept as its factors, and each merged weight is written by one fused product
(`torch.addmm(base, B, A)`) on the engine's thread: a trainer broadcasts one after every step,
and building every B·A product up front (the size of the adapted weights: ~400 MB for SmolLM2's
every linear layer in float32), then checking it, copying the base back and adding it, cost the
engine's core about a second a broadcast.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from asyncrl.inference.int8_linears import requantize
from asyncrl.inference.weight_roots import WeightLoadError, resolve_under_roots
from asyncrl.transport.fingerprint import tensor_checksums
from asyncrl.transport.weights.manifest import check_checksums


def weight_directory(path: str, roots: list[str]) -> Path:
    directory = resolve_under_roots(path, roots)
    if not directory.is_dir():
        raise WeightLoadError(f"{path}: not a directory")
    return directory


class UnreadableWeights(WeightLoadError):
    """A weights file that cannot be read whole (truncated, not safetensors)."""


def read_safetensors_dir(directory: Path, roots: list[str]) -> dict[str, torch.Tensor]:
    """All tensors of `model.safetensors`, or of the shards its index names, in memory of this
    process: read, not mapped, so a file changed or cut short on disk afterwards cannot change
    (or, truncated, crash) what the server checked and serves."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index, roots).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightLoadError(f"{index}: no `weight_map`")
        files = [directory / str(name) for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"{directory}: no .safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        resolved = resolve_under_roots(file, roots)
        try:
            data = resolved.read_bytes()
            with warnings.catch_warnings():  # the tensors' buffers are bytes: copied on staging
                warnings.filterwarnings("ignore", message="The given buffer is not writable")
                tensors.update(load_safetensors(data))
        except (SafetensorError, OSError) as error:
            raise UnreadableWeights(f"{file}: cannot read safetensors ({error})") from error
    return tensors


def files_bytes(directory: Path) -> int:
    """Bytes of the weights files a full load reads."""
    return sum(f.stat().st_size for f in directory.glob("*.safetensors"))


def read_json(file: Path, roots: list[str]) -> dict[str, Any]:
    resolved = resolve_under_roots(file, roots)
    try:
        data = json.loads(resolved.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise WeightLoadError(f"{file}: not readable JSON ({error})") from error
    if not isinstance(data, dict):
        raise WeightLoadError(f"{file}: not a JSON object")
    return data


def read_full_weights(
    model: torch.nn.Module, directory: Path, roots: list[str]
) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors, checked to cover the model exactly (names and shapes), as
    stored: everything a full update does before touching the model, so a refused update
    changes nothing and the reading can happen off the engine's thread."""
    tensors = read_safetensors_dir(directory, roots)
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
    if mismatched:
        raise WeightLoadError(f"{directory}: shape mismatch: {'; '.join(mismatched[:3])}")
    return tensors


def load_full_weights(model: torch.nn.Module, directory: Path, roots: list[str]) -> None:
    """Copy a checkpoint's tensors into the model in place; every parameter must be covered."""
    tensors = read_full_weights(model, directory, roots)
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in tensors.items():
            parameters[name].copy_(tensor.to(parameters[name].dtype))


def _is_tied(model: torch.nn.Module, name: str) -> bool:
    return name == "lm_head.weight" and bool(getattr(model.config, "tie_word_embeddings", False))


# a merged weight's entries are at most scale · rank · max|B| · max|A| in size; past this an
# adapter is refused (no trained adapter comes near it, and base + delta stays finite)
LARGEST_DELTA = 1e30


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    path: Path
    rank: int
    scale: float  # lora_alpha / r (or / sqrt(r) with rsLoRA)
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]  # parameter name -> (B, A), float32


def read_lora_adapter(
    name: str,
    directory: Path,
    model: torch.nn.Module,
    roots: list[str],
    expected: Mapping[str, str] | None = None,
) -> LoraAdapter:
    """Read a PEFT adapter directory into per-weight factors for this model, every one checked
    (rank, shapes, finite values, a merged weight that stays finite; with `expected`, the
    trainer's checksum of each tensor as saved) before the caller changes anything."""
    config_file = directory / "adapter_config.json"
    if not config_file.exists():
        raise WeightLoadError(f"{directory}: no adapter_config.json (not a PEFT adapter)")
    config = read_json(config_file, roots)
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise WeightLoadError(f"{config_file}: `r` must be a positive integer, not {rank!r}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise WeightLoadError(f"{config_file}: `lora_alpha` must be a number, not {alpha!r}")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise WeightLoadError(f"{config_file}: per-module ranks (rank_pattern) are not supported")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    tensors = read_safetensors_dir(directory, roots)
    if expected is not None:
        check_checksums(expected, tensor_checksums(tensors.items()), str(directory))
    parameters = dict(model.named_parameters())
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key, lora_a in tensors.items():
        if ".lora_A." not in key:
            continue
        lora_b = tensors.get(key.replace(".lora_A.", ".lora_B."))
        if lora_b is None:
            raise WeightLoadError(f"{directory}: `{key}` has no matching lora_B")
        target = _target_parameter(key.split(".lora_A.")[0])
        if target not in parameters:
            raise WeightLoadError(f"{directory}: adapter targets `{target}`, not in the model")
        expected = parameters[target].shape
        if (
            lora_a.ndim != 2 or lora_b.ndim != 2 or lora_a.shape[0] != rank
            or lora_b.shape[1] != rank or (lora_b.shape[0], lora_a.shape[1]) != tuple(expected)
        ):  # fmt: skip
            raise WeightLoadError(
                f"{directory}: `{key}` is {tuple(lora_a.shape)} and its lora_B "
                f"{tuple(lora_b.shape)}; rank {rank} on `{target}` {tuple(expected)} needs "
                f"({rank}, {expected[1]}) and ({expected[0]}, {rank})"
            )
        lora_a, lora_b = lora_a.float(), lora_b.float()
        if not (torch.isfinite(lora_a).all() and torch.isfinite(lora_b).all()):
            raise WeightLoadError(f"{directory}: `{key}` holds values that are not finite")
        bound = abs(scale) * rank * lora_b.abs().max().item() * lora_a.abs().max().item()
        if bound > LARGEST_DELTA:
            raise WeightLoadError(
                f"{directory}: `{key}` and its lora_B could add up to {bound:.3g} to a weight "
                f"(more than {LARGEST_DELTA:g}): values that are not finite once merged"
            )
        factors[target] = (lora_b, lora_a)
    if not factors:
        raise WeightLoadError(f"{directory}: adapter holds no LoRA weights")
    return LoraAdapter(name=name, path=directory, rank=rank, scale=scale, factors=factors)


def _target_parameter(module_path: str) -> str:
    """`base_model.model.<module path>` (PEFT's naming) -> `<module path>.weight`."""
    return f"{module_path.removeprefix('base_model.model.')}.weight"


def apply_lora(
    model: torch.nn.Module, base_weights: dict[str, torch.Tensor], adapter: LoraAdapter | None
) -> None:
    """Set every adapted weight to base + scale · B·A (or back to base when `adapter` is None),
    each in one pass over the weight: B·A (rank r) is never built on its own."""
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, base in base_weights.items():
            factors = adapter.factors.get(name) if adapter is not None else None
            parameter = parameters[name]
            if adapter is None or factors is None:
                parameter.copy_(base)
                continue
            lora_b, lora_a = (f.to(parameter.device) for f in factors)
            if parameter.dtype == torch.float32:
                torch.addmm(base, lora_b, lora_a, alpha=adapter.scale, out=parameter)
            else:  # merged in float32, rounded to the weight's dtype once
                parameter.copy_(torch.addmm(base.float(), lora_b, lora_a, alpha=adapter.scale))
    # an int8 layer is quantized from the merged float weight (or the base, unloaded), never
    # from its previous int8 copy
    requantize(model, [parameters[name] for name in base_weights])
