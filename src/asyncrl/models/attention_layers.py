"""The attention mask each kind of layer needs, when asyncrl builds the mask itself.

The embedded engine (slots of a KV cache) and the trainer's shared-prefix rows hand transformers
a ready 4-D boolean mask, and transformers uses a ready mask as it is, for every layer: the
layer's own `sliding_window` is ignored by the SDPA and eager kernels, which trust the mask. A
Llama attends to every earlier token in every layer, so one causal mask is right. Gemma 2/3
(and Qwen2 with `use_sliding_window`, Cohere 2, …) interleave *sliding-window* layers that see
only the last `sliding_window` positions with global ones; Mistral-style models slide in every
layer. Given one causal mask they attend too far, and their logprobs drift once a sequence
passes the window (Gemma 3 270M: 512 tokens) — silently, since nothing fails.

So the mask is built per layer type here, the way transformers' own `sliding_window_overlay`
does (a query at position q sees a key at position k when q - k < sliding_window), and given as
the `{layer type: mask}` mapping these models accept in place of one mask. Layer types whose
masks this cannot build (chunked attention, linear/recurrent layers, bidirectional attention)
are refused by name before anything is served or trained.
"""

from __future__ import annotations

from typing import Any

import torch

MASKED_LAYER_TYPES = {"full_attention", "sliding_attention"}


class UnsupportedAttentionError(ValueError):
    """The model has attention layers asyncrl cannot mask; the message says which."""


def check_attention_layers(config: Any, where: str) -> None:
    """Refuse a model whose layers need masks other than causal and sliding-window causal.

    `where` names the path that refuses (`the embedded engine`, `the trainer`)."""
    unknown = sorted(set(getattr(config, "layer_types", None) or []) - MASKED_LAYER_TYPES)
    if unknown:
        raise UnsupportedAttentionError(
            f"{where} cannot serve or train {config.model_type}: its layer types "
            f"{', '.join(unknown)} need attention masks it does not build (it builds causal and "
            "sliding-window causal ones); it would compute wrong logprobs rather than fail. "
            "Use `inference.backend: vllm` if vLLM supports this architecture."
        )
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedAttentionError(
            f"{where} cannot serve or train {config.model_type} with "
            "`use_bidirectional_attention: true` (an encoder, not a causal LM)"
        )


def sliding_window(config: Any) -> int | None:
    """The window of the model's sliding layers, or None where no layer slides."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if window is None or (types is not None and "sliding_attention" not in types):
        return None
    return int(window)


def layer_masks(
    config: Any,
    mask: torch.Tensor,  # [rows, 1, queries, keys] bool: causal (and which sequence)
    query_positions: torch.Tensor,  # [rows, queries]: each query's position in its sequence
    key_positions: torch.Tensor,  # [rows or 1, keys]: each key's position in its sequence
) -> torch.Tensor | dict[str, torch.Tensor]:
    """`mask` as the model's layers need it: unchanged where no layer slides; restricted to the
    window where every layer slides (no `layer_types`: Mistral); else one mask per layer type."""
    window = sliding_window(config)
    if window is None:
        return mask
    distance = query_positions[:, None, :, None] - key_positions[:, None, None, :]
    windowed = mask & (distance < window)
    if getattr(config, "layer_types", None) is None:
        return windowed
    return {"full_attention": mask, "sliding_attention": windowed}
