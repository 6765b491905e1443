"""`asyncrl eval`'s multi-turn episodes stop where the servers stop: on the turn's closing token,
and on the EOS where the template closes turns with another token (Gemma 3 IT's `<end_of_turn>`
beside `<eos>`) — a turn the EOS ended is the episode's last, as in training."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.envs.episode_tokens import EpisodeTokens
from asyncrl.envs.registry import load_environment
from asyncrl.play_episodes import play_episodes

FAVOURITE = 0  # every head row zeroed: all logits tie and greedy decoding picks token 0


def episode(tiny_model_dir: Path, eos_is_the_favourite: bool) -> tuple[list, list]:
    """One greedy guess-number episode of a model that always prefers token 0; returns the
    conversation and its prompt."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    closing = EpisodeTokens(tokenizer).end_of_turn
    assert closing != FAVOURITE
    if eos_is_the_favourite:  # the EOS moved off the closing token, onto what the model says
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(FAVOURITE)
        assert EpisodeTokens(tokenizer).end_of_turn == closing != tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()
    env = load_environment("guess-number", {"max_turns": 3})
    example = env.examples("eval", 1)[0]
    conversations = play_episodes(model, tokenizer, env, [example], max_tokens=4,
                                  temperature=0.0, batch_size=1, seed=0)  # fmt: skip
    return conversations[0], list(example.prompt)


def assistant_turns(conversation: list, prompt: list) -> int:
    return sum(message["role"] == "assistant" for message in conversation[len(prompt) :])


@pytest.mark.parametrize("eos_is_the_favourite", [False, True])
def test_a_turn_the_eos_ends_ends_the_episode(
    tiny_model_dir: Path, eos_is_the_favourite: bool
) -> None:
    conversation, prompt = episode(tiny_model_dir, eos_is_the_favourite)
    if eos_is_the_favourite:  # the first turn is the EOS alone: nothing more is played
        assert assistant_turns(conversation, prompt) == 1
        assert conversation[-1] == {"role": "assistant", "content": ""}
    else:  # token 0 is no stop: each turn is cut at max_tokens and the game goes on
        assert assistant_turns(conversation, prompt) == 3
