"""A tiny randomly initialised Gemma 3 (sliding-window and global layers, QK-norm, embeddings
scaled by √hidden, a tied head) whose window is 8 positions, so that sequences of a few dozen
tokens cross it: what the real model (window 512) shows only past 512 tokens."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from asyncrl.config.init_model import InitModelConfig
from asyncrl.models.init_model import init_model

WINDOW = 8


def write_tiny_gemma3(output: Path) -> Path:
    """The model directory: the character tokenizer of `init-model`, Gemma 3 weights."""
    init_model(InitModelConfig(preset="tiny", arch="llama", output_dir=str(output)))
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=WINDOW, max_position_embeddings=512, tie_word_embeddings=True,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention"],
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    model = Gemma3ForCausalLM(config)
    with torch.no_grad():  # a sharper distribution than the init's, so positions matter more
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.mul_(4)
    model.save_pretrained(output)
    return output
