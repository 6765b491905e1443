"""The reference model of β·KL: a frozen copy of the starting policy (with LoRA, the base with
adapters disabled, so no copy is made), its logprobs on a micro-batch, and the optional
TR-DPO-style sync that moves it toward the policy."""

from __future__ import annotations

import contextlib
import copy

import torch

from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.micro_batches import MicroBatch
from asyncrl.trainer.model import precision_context


def build_reference(model: torch.nn.Module, config: TrainerConfig) -> torch.nn.Module | None:
    """A frozen copy of the starting policy when β·KL needs one; with LoRA the base model with
    adapters disabled is the reference, so no copy is made."""
    if config.loss.beta == 0 or config.lora:
        return None
    reference = copy.deepcopy(model).eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference


@torch.no_grad()
def reference_logprobs_for(
    reference: torch.nn.Module | None,
    model: torch.nn.Module,
    mb: MicroBatch,
    config: TrainerConfig,
) -> torch.Tensor | None:
    if config.loss.beta == 0:
        return None
    context = model.disable_adapter() if reference is None else contextlib.nullcontext()
    with context, precision_context(config.recipe, mb.packed.input_ids.device):
        return completion_logprobs(reference or model, mb.packed, mb.temperature).logprobs


@torch.no_grad()
def maybe_sync_reference(
    reference: torch.nn.Module | None, model: torch.nn.Module, step: int, config: TrainerConfig
) -> None:
    """TR-DPO-style sync: ref ← α·policy + (1 − α)·ref every `ref_model_sync_steps`."""
    if reference is None or not config.sync_ref_model or step % config.ref_model_sync_steps:
        return
    alpha = config.ref_model_mixup_alpha
    for ref_param, param in zip(reference.parameters(), model.parameters(), strict=True):
        ref_param.mul_(1 - alpha).add_(param.detach(), alpha=alpha)
