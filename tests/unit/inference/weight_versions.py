"""Weights versions as a trainer writes them (`FilesRoute`: files, manifest, delta), for tests
of what servers make of them, and ways to damage them on disk."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from asyncrl.config.trainer import TrainerConfig
from asyncrl.transport.weights.files import FilesRoute


def trained(model_dir: Path, seed: int, scale: float = 1e-3) -> torch.nn.Module:
    """The model at `model_dir` with every weight moved a little (a step of training)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return model


def step(model: torch.nn.Module, seed: int, scale: float = 1e-3) -> None:
    """One more small update of every weight, in place."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)


def route(model_dir: Path, run_dir: Path, served_dtype: str = "float32", delta: str = "off"):
    config = TrainerConfig(
        model=str(model_dir), max_async_level=8,
        weight_broadcast={"served_dtype": served_dtype, "delta": delta},
    )  # fmt: skip
    return FilesRoute(config, run_dir)


def publish(files: FilesRoute, version: int, model: torch.nn.Module) -> Path:
    files.publish(version, model, None)
    files.wait()
    return files.run_dir / "broadcasts" / f"step_{version}"


def tensor_span(file: Path, name: str) -> tuple[int, int]:
    """Where tensor `name`'s bytes lie in a safetensors file: (start, end) offsets."""
    with open(file, "rb") as handle:
        size = struct.unpack("<Q", handle.read(8))[0]
        header = json.loads(handle.read(size))
    start, end = header[name]["data_offsets"]
    return 8 + size + start, 8 + size + end


def flip_bit(file: Path, name: str, bit: int = 3) -> None:
    """One bit of tensor `name`, in place, in the middle of its bytes."""
    start, end = tensor_span(file, name)
    at = (start + end) // 2
    with open(file, "r+b") as handle:
        handle.seek(at)
        byte = handle.read(1)[0]
        handle.seek(at)
        handle.write(bytes([byte ^ (1 << bit)]))
