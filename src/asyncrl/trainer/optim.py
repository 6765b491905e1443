"""Optimizer and learning-rate schedule shared by SFT and the GRPO trainer."""

from __future__ import annotations

import math

import torch

from asyncrl.bitsandbytes_import import quiet_bitsandbytes_import
from asyncrl.config.base import ConfigError
from asyncrl.config.training import TrainingConfig


def build_optimizer(model: torch.nn.Module, config: TrainingConfig) -> torch.optim.Optimizer:
    """AdamW (fused where the parameters are plain tensors); weight decay on matrices only (not
    on norms, biases)."""
    decay, no_decay = [], []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if config.optimizer == "adamw_8bit":
        try:
            with quiet_bitsandbytes_import():
                import bitsandbytes  # type: ignore[import-not-found]
        except ImportError as error:
            raise ConfigError(
                "`optimizer: adamw_8bit` needs bitsandbytes (and a GPU); "
                "install it or set `optimizer: adamw`"
            ) from error
        return bitsandbytes.optim.AdamW8bit(groups, lr=config.learning_rate)
    # one fused kernel per parameter instead of a pass over memory per operation: 3.2x faster
    # on 135 M parameters on one CPU core (0.39 -> 0.13 s a step); sharded (DTensor) parameters
    # keep the per-operation path
    sharded = any(hasattr(parameter, "to_local") for parameter in decay + no_decay)
    return torch.optim.AdamW(groups, lr=config.learning_rate, fused=not sharded)


def lr_multiplier(step: int, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Factor on the peak learning rate before optimizer step `step` (0-based).

    Linear warmup from 1/(warmup+1) to 1 over `warmup_steps`, then constant, linear to 0, or
    cosine to 0 at `total_steps`. With no known total (-1) only warmup and constant apply.
    """
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant" or total_steps <= 0:
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr schedule {schedule!r}")


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainingConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_multiplier(
            step, config.warmup_steps, total_steps, config.lr_scheduler_type
        ),
    )
