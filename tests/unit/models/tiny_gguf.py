"""A tiny Llama written as a GGUF file the way llama.cpp's converter writes one (q/k rows
permuted for its rotary layout, a GPT-2 byte-level vocabulary in the metadata), from a
transformers model kept as the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

HEADS, KV_HEADS, LAYERS = 4, 2, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's reordering of q/k rows (interleaved rotary halves), which readers undo."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def write_tiny_gguf(path: Path, architecture: str = "llama") -> LlamaForCausalLM:
    """Write the file; return the model whose weights it holds (float32, tied head)."""
    import gguf

    torch.manual_seed(0)
    tokens = SPECIALS + list(bytes_to_unicode().values()) + ["Ġt", "Ġth"]
    config = LlamaConfig(
        vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=128,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny test llama")
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(128)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(16)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(["Ġ t", "Ġt h"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    weights = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    names = {
        "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    }  # fmt: skip
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        q = weights[prefix + "self_attn.q_proj.weight"]
        k = weights[prefix + "self_attn.k_proj.weight"]
        writer.add_tensor(f"blk.{layer}.attn_q.weight", llama_cpp_permute(q, HEADS))
        writer.add_tensor(f"blk.{layer}.attn_k.weight", llama_cpp_permute(k, KV_HEADS))
        for gguf_name, hf_name in names.items():
            tensor = weights[f"{prefix}{hf_name}.weight"]
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model
