"""A character-level tokenizer (printable ASCII + chat special tokens) with a ChatML template.

It is a byte-level BPE with no merges: every ASCII character is one token. That shape matters:
for some model types (qwen2) `AutoTokenizer` ignores the saved class and rebuilds a byte-level
BPE from the saved vocab and merges; with no merges that rebuild tokenizes exactly as this one
does, so the saved files load the same through every Auto path, in transformers and in vLLM.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, UNK, IM_START, IM_END = "<pad>", "<unk>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, UNK, IM_START, IM_END]
# printable ASCII (space to tilde) plus the two whitespace characters text actually uses
CHARACTERS = [chr(code) for code in range(32, 127)] + ["\n", "\t"]
assert set(CHARACTERS) <= set(string.printable)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_char_tokenizer(model_max_length: int = 2048) -> PreTrainedTokenizerFast:
    """Every character is one token; special tokens are matched before splitting."""
    byte_to_symbol = _bytes_to_unicode()
    symbols = [byte_to_symbol[ord(character)] for character in CHARACTERS]
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + symbols)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        unk_token=UNK,
        eos_token=IM_END,
        model_max_length=model_max_length,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable symbol map, which byte-level BPE vocabularies use."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    symbols = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            symbols.append(256 + extra)
            extra += 1
    return {byte: chr(symbol) for byte, symbol in zip(printable, symbols, strict=True)}
