"""A demonstrated episode becomes the sequence RL would build, with the loss on the model's
turns only."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from asyncrl.envs.calculator import CalculatorEnv
from asyncrl.envs.guess_number import GuessNumberEnv
from asyncrl.envs.multi_turn import UNTRAINED
from asyncrl.sft.data import episode_sample


def test_a_demonstrated_episode_trains_on_the_assistant_turns_only(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    env = GuessNumberEnv()
    example = next(e for e in env.examples("train", 20) if len(env.demonstration(e)) >= 5)
    messages = env.demonstration(example)
    sample = episode_sample(messages, len(example.prompt), tokenizer)

    rendered = tokenizer.apply_chat_template(messages)
    rendered = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    # ChatML renders turns honestly: the appended episode is its rendering but the final "\n"
    assert sample.input_ids == rendered[:-1]
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    guesses = [m["content"] for m in messages if m["role"] == "assistant"]
    expected = []
    for guess in guesses:
        expected += [
            *tokenizer(guess, add_special_tokens=False)["input_ids"],
            tokenizer.eos_token_id,
        ]
    assert trained == expected


def test_a_turn_marked_untrained_is_shown_but_not_trained_on(tiny_model_dir: Path) -> None:
    """The same tokens as the unmarked episode; the loss on every assistant turn but the marked
    one (calculator's slipped call, when it demonstrates a retry)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    env = CalculatorEnv(retry_demos=1.0)
    example = env.examples("train", 1)[0]
    messages = env.demonstration(example)
    sample = episode_sample(messages, len(example.prompt), tokenizer)
    unmarked = [{k: v for k, v in m.items() if k != UNTRAINED} for m in messages]
    everything = episode_sample(unmarked, len(example.prompt), tokenizer)
    assert sample.input_ids == everything.input_ids
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    expected = []
    for message in messages[len(example.prompt) :]:
        if message["role"] == "assistant" and UNTRAINED not in message:
            expected += [
                *tokenizer(message["content"], add_special_tokens=False)["input_ids"],
                tokenizer.eos_token_id,
            ]
    assert trained == expected and len(trained) < sum(everything.loss_mask)
    misspelt = [{**m, UNTRAINED: "yes"} if UNTRAINED in m else m for m in messages]
    with pytest.raises(ValueError, match="untrained: 'yes'"):
        episode_sample(misspelt, len(example.prompt), tokenizer)
