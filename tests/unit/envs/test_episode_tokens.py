"""Episode token ids built by appending equal the template's rendering where it is honest, and
stay the model's own tokens where re-rendering would rewrite them."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from asyncrl.envs.episode_tokens import EpisodeTokens, SuffixError

# earlier assistant turns shortened to 3 characters, as templates strip earlier reasoning
REWRITING = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' and not loop.last %}{{ message['content'][:3] }}"
    "{% else %}{{ message['content'] }}{% endif %}{{ '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# the message count up front: every turn changes the conversation's first tokens
COUNTING = "{{ messages | length }}" + REWRITING
# assistant turns not closed by the end-of-turn token generation stops on
UNCLOSED = REWRITING.replace("'<|im_end|>' + '\n'", "'\n\n'")


@pytest.fixture
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def appended(
    tokens: EpisodeTokens, tokenizer: PreTrainedTokenizerBase, turns: list[str]
) -> list[int]:
    """prompt, then per turn: the model's ids and its end-of-turn, then the user's 'lower'."""
    episode = tokens.prompt_ids([{"role": "user", "content": "guess"}])
    for index, text in enumerate(turns):
        episode += [*ids(tokenizer, text), tokens.end_of_turn]
        if index < len(turns) - 1:
            episode += tokens.suffix_ids([{"role": "user", "content": "lower"}])
    return episode


def conversation(turns: list[str]) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": "guess"}]
    for index, text in enumerate(turns):
        messages.append({"role": "assistant", "content": text})
        if index < len(turns) - 1:
            messages.append({"role": "user", "content": "lower"})
    return messages


def test_appended_turns_equal_an_honest_templates_rendering(tokenizer) -> None:
    tokens = EpisodeTokens(tokenizer)
    turns = ["12", "7", "a longer answer"]
    rendered = tokens.render(conversation(turns), generation_prompt=False)
    assert appended(tokens, tokenizer, turns) == rendered[: len(appended(tokens, tokenizer, turns))]
    # the rendering closes the last turn with "\n" after the end-of-turn token: nothing else
    assert rendered[len(appended(tokens, tokenizer, turns)) :] == ids(tokenizer, "\n")


def test_appended_turns_keep_the_models_tokens_where_the_template_rewrites_them(tokenizer) -> None:
    tokenizer.chat_template = REWRITING
    tokens = EpisodeTokens(tokenizer)
    turns = ["12345", "678910"]
    episode = appended(tokens, tokenizer, turns)
    naive = tokens.render(conversation(turns), generation_prompt=False)
    assert naive[: len(episode)] != episode  # re-rendering drops "45" from the first turn
    first_turn = tokens.prompt_ids([{"role": "user", "content": "guess"}])
    assert episode[len(first_turn) : len(first_turn) + 5] == ids(tokenizer, "12345")
    assert tokenizer.decode(episode) == (
        "<|im_start|>user\nguess<|im_end|>\n<|im_start|>assistant\n12345<|im_end|>\n"
        "<|im_start|>user\nlower<|im_end|>\n<|im_start|>assistant\n678910<|im_end|>"
    )


def test_a_turn_closed_by_a_special_token_other_than_the_eos_is_appended_and_stopped_on(
    tokenizer,
) -> None:
    """Gemma 3's instruction-tuned way: its template closes a model turn with `<end_of_turn>`
    while its tokenizer's EOS is `<eos>`. Here ChatML's turns with the EOS moved to `<unk>`."""
    closing = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert EpisodeTokens(tokenizer).end_of_turn == closing  # ChatML: the EOS closes a turn
    assert EpisodeTokens(tokenizer).stop_token_ids == []  # the servers stop on it already
    tokenizer.eos_token = "<unk>"
    tokens = EpisodeTokens(tokenizer)
    assert tokens.end_of_turn == closing != tokenizer.eos_token_id
    assert tokens.stop_token_ids == [closing]  # requests ask the servers to stop on it
    tokens.check()
    turns = ["12", "7"]
    rendered = tokens.render(conversation(turns), generation_prompt=False)
    assert appended(tokens, tokenizer, turns) == rendered[: len(appended(tokens, tokenizer, turns))]
    tokenizer.chat_template = None  # a base model's plain prompts: the EOS ends a completion
    assert EpisodeTokens(tokenizer).end_of_turn == tokenizer.eos_token_id


@pytest.mark.parametrize(
    ("template", "says"), [(COUNTING, "earlier turns differently"), (UNCLOSED, "does not close")]
)
def test_a_template_that_cannot_append_a_turn_is_refused(tokenizer, template, says) -> None:
    tokenizer.chat_template = template
    with pytest.raises(SuffixError, match=says):
        EpisodeTokens(tokenizer).check()


# Qwen3's way with reasoning: the assistant turn after the last user message opens with a
# `<think>` block (empty when there is no reasoning); once a user message follows, that turn is
# rendered without it. Written here in the same shape, for Qwen's real BPE vocabulary.
THINK_ON_LAST_TURN = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for message in messages -%}{%- if message['role'] == 'user' -%}"
    "{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' -}}"
    "{%- if message['role'] == 'assistant' and loop.index0 > ns.last_user -%}"
    "{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}"
    "{{- message['content'] + '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


@pytest.mark.slow
def test_a_bpe_template_that_rewrites_the_last_turn_once_one_follows_is_refused_at_start_up(
    qwen2_tokenizer,
) -> None:
    from asyncrl.config.base import ConfigError
    from asyncrl.envs.guess_number import GuessNumberEnv
    from asyncrl.orchestrator.episode import episode_tokens

    tokenizer = copy.deepcopy(qwen2_tokenizer)
    env = GuessNumberEnv()
    assert episode_tokens([env], ["guess"], tokenizer) is not None  # asyncrl's template: fine
    tokenizer.chat_template = THINK_ON_LAST_TURN
    stand_in = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}]
    alone = ids(tokenizer, tokenizer.apply_chat_template(stand_in, tokenize=False))
    followed = tokenizer.apply_chat_template([*stand_in, {"role": "user", "content": "y"}],
                                             tokenize=False)  # fmt: skip
    assert 151667 in alone and ids(tokenizer, followed)[: len(alone)] != alone  # <think> gone
    with pytest.raises(SuffixError, match="earlier turns differently"):
        EpisodeTokens(tokenizer).check()
    with pytest.raises(ConfigError, match="env guess: the chat template renders"):
        episode_tokens([env], ["guess"], tokenizer)
