"""The base the servers apply LoRA adapters to when it is not the model's own: a QLoRA
trainer's dequantized base (`trainer.qlora_served_base: dequantized`).

The trainer writes `<run_dir>/served_base/` once at start: `model.safetensors` (Hugging Face
names, every parameter of the base, a tied head once) and `SERVED_BASE` (JSON: fingerprint and
what it was made from), in a directory filled under a temporary name and renamed whole, so a
reader that finds the marker finds whole weights. The orchestrator loads it into every server as
a full update before any rollout, and again into a server that restarted, before any adapter.
A restarted trainer leaves it in place when it holds the same weights.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from asyncrl.fs import atomic_directory, atomic_write_bytes
from asyncrl.run.layout import SERVED_BASE_MARKER, served_base_dir
from asyncrl.transport.fingerprint import weights_fingerprint


@dataclass(frozen=True)
class ServedBase:
    path: Path
    fingerprint: str
    source: str  # the model and the format it was made from, for people reading the marker


def write_served_base(
    run_dir: str | Path, tensors: dict[str, torch.Tensor], source: str
) -> ServedBase:
    """Publish `tensors` as the served base, unless the same weights are already there."""
    fingerprint = weights_fingerprint(tensors.items())
    existing = read_served_base(run_dir)
    if existing is not None and existing.fingerprint == fingerprint:
        return existing
    target = served_base_dir(run_dir)
    with atomic_directory(target) as staging:
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        marker = {"fingerprint": fingerprint, "source": source, "time": time.time()}
        atomic_write_bytes(staging / SERVED_BASE_MARKER, json.dumps(marker).encode())
    return ServedBase(target, fingerprint, source)


def read_served_base(run_dir: str | Path) -> ServedBase | None:
    """The published served base, or None while there is none (yet)."""
    path = served_base_dir(run_dir)
    marker = path / SERVED_BASE_MARKER
    if not marker.exists():
        return None
    try:
        data = json.loads(marker.read_text())
        return ServedBase(path, str(data["fingerprint"]), str(data["source"]))
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{marker}: not a valid served-base marker ({error})") from error
