"""Load a Hugging Face causal LM for training, and the precision context its recipe asks for.

Recipes: `fp32` computes in float32; `bf16` keeps float32 master weights (and optimizer state)
and runs forward/backward under bfloat16 autocast. With LoRA the frozen base is stored in
bfloat16 under `bf16`, and the adapters stay float32; with QLoRA the base's Linear layers are
stored quantized and computed in the recipe's dtype. `auto` is resolved before a model is
loaded (`resolve_training_precision`), so these functions only ever see `fp32` or `bf16`.
"""

from __future__ import annotations

import contextlib
import importlib.util
from typing import TypeVar

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from asyncrl.bitsandbytes_import import quiet_bitsandbytes_import
from asyncrl.config.training import TrainingConfig
from asyncrl.log import get_logger
from asyncrl.models.attention_layers import check_attention_layers
from asyncrl.monitor.metrics import MetricsWriter
from asyncrl.precision import PrecisionChoice, default_device, resolve_recipe
from asyncrl.trainer.quantized_base import (
    base_quantization,
    loading_arguments,
    prepare_quantized_base,
)

logger = get_logger(__name__)


def attention_implementation(dense_mask: bool = False) -> str:
    """flash-attention 2 on a GPU where it is installed (its varlen kernel reads sample
    boundaries from the restarting position ids), else SDPA with transformers' block-diagonal
    mask. `dense_mask`: the rows carry a 4-D mask (shared prefixes), which only SDPA takes.
    The GPU path is written for GPU machines and untested on this CPU-only project CI."""
    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        if not dense_mask:
            return "flash_attention_2"
        logger.warning(
            "trainer.shared_prefix: SDPA with a dense [rows, 1, L, L] mask instead of "
            "flash-attention (O(L²) memory per row; a FlexAttention block mask is not built)"
        )
    return "sdpa"


ConfigT = TypeVar("ConfigT", bound=TrainingConfig)


def resolve_training_precision(
    config: ConfigT, metrics: MetricsWriter | None
) -> tuple[ConfigT, PrecisionChoice]:
    """The config with `recipe: auto` replaced by what this device runs fast; the choice and
    its reason go to the log and to the run header of `metrics.jsonl` (when given one)."""
    choice = resolve_recipe(config.recipe, default_device())
    if metrics is not None:
        metrics.header(choice.header())
    return config.model_copy(update={"recipe": choice.recipe}), choice


def load_model(config: TrainingConfig, dense_mask: bool = False) -> torch.nn.Module:
    """The model to train; `dense_mask` when its rows will carry a 4-D attention mask. With a
    QLoRA key the frozen base is quantized as it loads (`quantized_base.py`)."""
    _check_resolved(config.recipe)
    base_dtype = torch.bfloat16 if config.lora and config.recipe == "bf16" else torch.float32
    quantization = base_quantization(config, base_dtype, default_device())
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        config.model,
        dtype=base_dtype,
        trust_remote_code=config.trust_remote_code,
        attn_implementation=attention_implementation(dense_mask),
        **loading_arguments(quantization, default_device()),
    )
    check_attention_layers(model.config, "the trainer")
    if quantization is not None:
        prepare_quantized_base(model)
    elif torch.cuda.is_available():
        model = model.cuda()
    model.config.use_cache = False
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if not config.lora:
        return model
    with quiet_bitsandbytes_import():  # peft imports bitsandbytes where it is installed
        from peft import LoraConfig, get_peft_model

    lora_config = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=config.lora_target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora_config)


def precision_context(
    recipe: str, device: torch.device | str = "cpu"
) -> contextlib.AbstractContextManager:
    """Wrap forward (and so backward) passes: bfloat16 autocast for `bf16`, nothing for `fp32`."""
    _check_resolved(recipe)
    if recipe == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _check_resolved(recipe: str) -> None:
    if recipe not in ("fp32", "bf16"):
        raise ValueError(f"recipe {recipe!r} must be resolved to fp32 or bf16 first")
