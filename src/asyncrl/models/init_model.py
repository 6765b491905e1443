"""`asyncrl init-model`: a randomly initialised Llama- or Qwen2-shaped model, built locally.

Saved with `save_pretrained` (safetensors + config + tokenizer + generation config), so
`AutoModelForCausalLM`, `AutoTokenizer` and vLLM load it like a hub checkpoint. The tokenizer is
the character-level one, or Qwen's BPE vocabulary (`qwen_tokenizer.py`); the embedding has one
row per token, rounded up to a multiple of 128.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    GenerationConfig,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from asyncrl.config.init_model import InitModelConfig
from asyncrl.log import get_logger
from asyncrl.models.char_tokenizer import build_char_tokenizer

logger = get_logger(__name__)

VOCAB_SIZE = 128  # the character tokenizer's 101 tokens, rounded up for aligned matmuls
VOCAB_MULTIPLE = 128  # embedding rows are rounded up to this (aligned matmuls)
MAX_POSITIONS = 2048


@dataclass(frozen=True)
class Preset:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int


PRESETS = {
    "tiny": Preset(
        hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384
    ),
    "small": Preset(
        hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2, intermediate_size=1024
    ),
    "base": Preset(
        hidden_size=512, num_layers=16, num_heads=8, num_kv_heads=4, intermediate_size=1536
    ),
}


def model_config(
    preset_name: str,
    arch: str,
    pad_token_id: int,
    eos_token_id: int,
    tied: bool = True,
    vocab_size: int = VOCAB_SIZE,
) -> PretrainedConfig:
    preset = PRESETS[preset_name]
    common = dict(
        vocab_size=vocab_size,
        hidden_size=preset.hidden_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads,
        intermediate_size=preset.intermediate_size,
        max_position_embeddings=MAX_POSITIONS,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    return Qwen2Config(use_sliding_window=False, **common)


def init_model(config: InitModelConfig) -> Path:
    """Build, initialise with `config.seed`, save; returns the output directory."""
    output_dir = Path(config.output_dir)
    tokenizer = build_tokenizer(config.tokenizer)
    hf_config = model_config(
        config.preset,
        config.arch,
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        config.tie_word_embeddings,
        embedding_rows(len(tokenizer)),
    )
    torch.manual_seed(config.seed)
    if config.head == "sequence-classification":  # a reward model: one score per text
        hf_config.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(hf_config, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
        model.generation_config = GenerationConfig(
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    num_params = sum(parameter.numel() for parameter in model.parameters())
    logger.info(
        "saved %s-shaped `%s` model with the %s tokenizer (%.2f M parameters) to %s",
        config.arch,
        config.preset,
        config.tokenizer,
        num_params / 1e6,
        output_dir,
    )
    return output_dir


def build_tokenizer(name: str) -> PreTrainedTokenizerFast:
    if name == "char":
        return build_char_tokenizer(model_max_length=MAX_POSITIONS)
    from asyncrl.models.qwen_tokenizer import build_qwen_tokenizer  # needs the `qwen` extra

    return build_qwen_tokenizer(name, model_max_length=MAX_POSITIONS)  # type: ignore[arg-type]


def embedding_rows(tokens: int) -> int:
    """The embedding's size for a vocabulary of `tokens`: the character tokenizer's fixed 128,
    else the vocabulary rounded up to a multiple of `VOCAB_MULTIPLE`. Ids past the vocabulary
    (never in a prompt) can still be sampled by an untrained model; they decode to nothing."""
    return max(VOCAB_SIZE, -(-tokens // VOCAB_MULTIPLE) * VOCAB_MULTIPLE)
