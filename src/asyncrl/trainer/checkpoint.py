"""Trainer checkpoints: weights, optimizer, scheduler, RNG and step, written atomically.

Weights go through safetensors (`save_model` handles tied embeddings); the rest through
`torch.save` and is read back with `weights_only=True`, which refuses anything but tensors and
plain containers — nothing in a checkpoint can run code when loaded.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from asyncrl.checkpoint.layout import mark_complete
from asyncrl.fs import atomic_directory

WEIGHTS = "weights.safetensors"
STATE = "state.pt"


def save_trainer_checkpoint(
    directory: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> None:
    with atomic_directory(directory) as staging:
        save_model(model, str(staging / WEIGHTS))
        torch.save(
            {
                "step": step,
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
            },
            staging / STATE,
        )
    mark_complete(directory, step)


def load_trainer_checkpoint(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> int:
    """Restore everything in place; returns the step the checkpoint was taken after."""
    load_model(model, str(directory / WEIGHTS), strict=True)
    state = torch.load(directory / STATE, weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])
