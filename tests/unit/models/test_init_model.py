from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.init_model import InitModelConfig
from asyncrl.models.char_tokenizer import build_char_tokenizer
from asyncrl.models.init_model import init_model, model_config

SAMPLE = "Hello,  world!\n\tend ~{}"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_saved_model_reloads_through_the_auto_classes(tmp_path: Path, arch: str) -> None:
    output = init_model(InitModelConfig(preset="tiny", arch=arch, output_dir=str(tmp_path / arch)))
    assert json.loads((output / "config.json").read_text())["model_type"] == arch
    model = AutoModelForCausalLM.from_pretrained(output)
    tokenizer = AutoTokenizer.from_pretrained(output)
    reference = build_char_tokenizer()

    # the Auto path (which, for qwen2, rebuilds a Qwen2Tokenizer) tokenizes like our builder
    assert tokenizer(SAMPLE)["input_ids"] == reference(SAMPLE)["input_ids"]
    assert tokenizer.decode(tokenizer(SAMPLE)["input_ids"]) == SAMPLE
    messages = [{"role": "user", "content": "ab c"}]
    assert (
        tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
        == (reference.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])
    )
    assert tokenizer.eos_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id

    ids = torch.tensor([tokenizer(SAMPLE)["input_ids"]])
    logits = model(ids).logits
    assert logits.shape == (1, len(SAMPLE), model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_same_seed_gives_identical_weights(tmp_path: Path) -> None:
    first = init_model(InitModelConfig(preset="tiny", output_dir=str(tmp_path / "a"), seed=3))
    second = init_model(InitModelConfig(preset="tiny", output_dir=str(tmp_path / "b"), seed=3))
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()


@pytest.mark.parametrize(
    ("preset", "low", "high"), [("tiny", 0.3e6, 1.0e6), ("small", 7e6, 13e6), ("base", 40e6, 60e6)]
)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_preset_sizes(preset: str, low: float, high: float, arch: str) -> None:
    config = model_config(preset, arch, pad_token_id=0, eos_token_id=3)
    with torch.device("meta"):  # count parameters without allocating them
        model = AutoModelForCausalLM.from_config(config)
    assert low <= sum(p.numel() for p in model.parameters()) <= high


def test_embedding_rows_are_the_vocabulary_rounded_up_to_128() -> None:
    from asyncrl.models.init_model import embedding_rows

    assert embedding_rows(101) == 128  # the character tokenizer's fixed size
    assert embedding_rows(151_669) == 151_680  # qwen2: 151,643 BPE + 26 special tokens
    assert embedding_rows(248_077) == 248_192  # qwen3.6
    assert embedding_rows(256) == 256


def test_an_unknown_tokenizer_is_refused_naming_the_choices() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"'char', 'qwen2' or 'qwen3\.6'"):
        InitModelConfig(tokenizer="gpt2")


@pytest.mark.slow
def test_a_bpe_model_loads_through_the_auto_classes_with_one_row_per_token(
    tiny_bpe_dir: Path,
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_bpe_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_bpe_dir)
    assert json.loads((tiny_bpe_dir / "config.json").read_text())["model_type"] == "qwen2"
    assert len(tokenizer) == 151_669 and model.config.vocab_size == 151_680
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == 151_645
    assert tokenizer.pad_token_id == model.config.pad_token_id == 151_643
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "héllo"}],
                                        add_generation_prompt=True)["input_ids"]  # fmt: skip
    assert ids[:3] == [151644, 872, 198]
    logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 151_680) and torch.isfinite(logits).all()
