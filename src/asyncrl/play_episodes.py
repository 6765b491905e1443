"""Multi-turn episodes played in this process with `model.generate`, for `asyncrl eval` and the
evaluation that closes `asyncrl sft`.

The turns are built as in training (`EpisodeTokens`: the model's own tokens, then the
environment's messages appended as tokens), so a model is scored on the inputs it was trained
on. The environment runs in this process too, as a single-turn environment's rubric does here.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from asyncrl.envs.base import Example, Messages
from asyncrl.envs.episode_tokens import EpisodeTokens
from asyncrl.envs.multi_turn import MultiTurnEnvironment


@torch.no_grad()
def play_episodes(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    env: MultiTurnEnvironment,
    examples: list[Example],
    *,
    max_tokens: int,
    temperature: float,
    batch_size: int,
    seed: int,
) -> list[Messages]:
    """Each example's episode (its conversation), in order; greedy when temperature is 0.
    `max_tokens` is per model turn."""
    torch.manual_seed(seed)
    tokens = EpisodeTokens(tokenizer)
    end_of_turn = tokens.end_of_turn
    # the servers stop on the EOS too: a turn ended by it (where it is not the turn's closing)
    # cannot be continued as tokens, and its episode ends there, as in `orchestrator/episode.py`
    stops = [end_of_turn, *tokens.stop_token_ids, tokenizer.eos_token_id]
    stops = list(dict.fromkeys(t for t in stops if t is not None))
    conversations = [list(example.prompt) for example in examples]
    ids = [tokens.prompt_ids(example.prompt) for example in examples]
    playing = list(range(len(examples)))
    for turn in range(env.max_turns):
        turns = {}
        for start in range(0, len(playing), batch_size):
            chunk = playing[start : start + batch_size]
            outputs = generate_turn(
                model, tokenizer, [ids[i] for i in chunk], max_tokens, temperature, stops
            )
            turns.update(zip(chunk, outputs, strict=True))
        still_playing = []
        for index in playing:
            turn_ids = turns[index]
            text = tokenizer.decode(turn_ids, skip_special_tokens=True)
            conversations[index].append({"role": "assistant", "content": text})
            ids[index] += turn_ids
            ended_by_eos = bool(turn_ids) and turn_ids[-1] in stops and turn_ids[-1] != end_of_turn
            if turn == env.max_turns - 1 or ended_by_eos:
                continue
            reply = env.respond(conversations[index], examples[index])
            if reply.done:
                continue
            if not turn_ids or turn_ids[-1] != end_of_turn:  # cut by max_tokens: closed
                ids[index].append(end_of_turn)
            conversations[index].extend(reply.messages)
            ids[index] += tokens.suffix_ids(reply.messages, turn_end=end_of_turn)
            still_playing.append(index)
        playing = still_playing
    return conversations


def generate_turn(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    max_tokens: int,
    temperature: float,
    stops: list[int],
) -> list[list[int]]:
    """One turn per prompt (left-padded into one batch): its new ids up to and including the
    first of the `stops` tokens."""
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )
    output = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_tokens,
        eos_token_id=stops,
        pad_token_id=pad,
        **sampling,
    )
    turns = []
    for row in output[:, width:].tolist():
        end = next((at + 1 for at, token in enumerate(row) if token in stops), len(row))
        turns.append(row[:end])
    return turns
