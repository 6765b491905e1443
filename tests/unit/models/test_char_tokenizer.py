from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from asyncrl.models.char_tokenizer import CHARACTERS, SPECIAL_TOKENS, build_char_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_char_tokenizer()


@pytest.mark.parametrize(
    "text", ["hello world", "  two  spaces ", "a\nb\tc", "~!@#$%^&*()_+{}|:<>?"]
)
def test_every_character_is_one_token_and_decodes_back(
    tokenizer: PreTrainedTokenizerFast, text: str
) -> None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_all_printable_ascii_has_distinct_ids(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in CHARACTERS]
    assert all(len(i) == 1 for i in ids)
    assert len({i[0] for i in ids}) == len(CHARACTERS)
    assert len(tokenizer) == len(CHARACTERS) + len(SPECIAL_TOKENS)


def test_special_tokens_are_single_tokens_inside_text(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = tokenizer("ab<|im_end|>c", add_special_tokens=False)["input_ids"]
    assert ids[2] == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert len(ids) == 4
    assert tokenizer.decode(ids, skip_special_tokens=True) == "abc"


def test_chat_template_is_chatml_with_generation_prompt(tokenizer: PreTrainedTokenizerFast) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "abc"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nabc<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert not without.endswith("assistant\n")


def test_templated_ids_match_tokenizing_the_templated_text(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    messages = [{"role": "user", "content": "x y"}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert encoded["input_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"]
