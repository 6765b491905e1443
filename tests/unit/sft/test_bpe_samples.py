"""Under byte-level BPE, `asyncrl sft` tokenizes the way rollouts are tokenized: a prompt is the
ids the server renders for the same messages, a demonstrated answer its own tokens then the
end-of-turn token (what a model that writes the answer samples), and a demonstrated tool episode
the sequence RL appends turn by turn."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.envs import load_environment
from asyncrl.envs.calculator import CalculatorEnv
from asyncrl.envs.episode_tokens import EpisodeTokens
from asyncrl.inference.prompt_encoder import PromptEncoder
from asyncrl.inference.protocol import ChatMessage
from asyncrl.sft.data import episode_sample, sft_sample

pytestmark = pytest.mark.slow  # the session builds the BPE tokenizer once (10-30 s)


def served_prompt(tokenizer, messages) -> list[int]:
    """The prompt ids the embedded server renders for a chat request."""
    encoder = PromptEncoder(tokenizer, max_model_len=4096, trust_request_template=False)
    chat = [ChatMessage(**message) for message in messages]
    return asyncio.run(encoder.render(chat, add_generation_prompt=True))


def split(sample) -> tuple[list[int], list[int]]:
    start = sample.loss_mask.index(True)
    assert all(sample.loss_mask[start:])
    return sample.input_ids[:start], sample.input_ids[start:]


def test_a_single_turn_sample_is_the_served_prompt_then_the_answers_own_tokens(
    qwen2_tokenizer,
) -> None:
    pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra is not installed")
    tokenizer = qwen2_tokenizer
    env = load_environment("reasoning-gym/word_sorting", {"system_prompt": "default"})
    for example in env.examples("train", 8):
        for sample, answer in [
            (sft_sample(example, tokenizer), example.answer),
            (episode_sample(env.demonstration(example), len(example.prompt), tokenizer),
             env.demonstration(example)[-1]["content"]),
        ]:  # fmt: skip
            prompt, completion = split(sample)
            assert prompt == served_prompt(tokenizer, example.prompt)
            assert completion == [*tokenizer(answer)["input_ids"], tokenizer.eos_token_id]


def test_a_demonstrated_tool_episode_is_what_rl_appends_and_what_the_template_renders(
    qwen2_tokenizer,
) -> None:
    tokenizer = qwen2_tokenizer
    env = CalculatorEnv(describe_tools=True)
    tokens = EpisodeTokens(tokenizer)
    for example in env.examples("train", 4):
        messages = env.demonstration(example)
        sample = episode_sample(messages, len(example.prompt), tokenizer)
        # RL's sequence: the served prompt, each model turn's ids and end-of-turn, then the
        # tool result appended as the suffix after that end-of-turn token
        expected = served_prompt(tokenizer, example.prompt)
        trained = []
        for message in messages[len(example.prompt) :]:
            if message["role"] == "assistant":
                turn = [*tokenizer(message["content"])["input_ids"], tokenizer.eos_token_id]
                expected += turn
                trained += turn
            else:
                expected += tokens.suffix_ids([message])
        assert sample.input_ids == expected
        assert [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m] == trained
        # asyncrl's template renders each turn by itself: the same as one rendering of the
        # whole episode, up to the "\n" that closes the last turn
        rendered = tokens.render(messages, generation_prompt=False)
        assert rendered == [*expected, *tokenizer("\n")["input_ids"]]
        assert "<tool_response>" in tokenizer.decode(sample.input_ids)
