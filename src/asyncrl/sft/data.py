"""Turn an environment's (prompt, answer) pairs, or a multi-turn environment's demonstrated
episodes, into chat-formatted training samples."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from asyncrl.envs import Example
from asyncrl.envs.base import Messages
from asyncrl.envs.episode_tokens import EpisodeTokens
from asyncrl.envs.multi_turn import UNTRAINED
from asyncrl.trainer.packing import Sample


def sft_sample(example: Example, tokenizer: PreTrainedTokenizerBase) -> Sample:
    """Prompt with the generation header, then the answer and end-of-turn; loss on the latter."""
    prompt_ids = tokenizer.apply_chat_template(example.prompt, add_generation_prompt=True)
    if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
        prompt_ids = prompt_ids["input_ids"]
    answer_ids = tokenizer(example.answer, add_special_tokens=False)["input_ids"]
    completion_ids = [*answer_ids, tokenizer.eos_token_id]
    return Sample(
        input_ids=[*prompt_ids, *completion_ids],
        loss_mask=[False] * len(prompt_ids) + [True] * len(completion_ids),
    )


def episode_sample(
    messages: Messages, prompt_length: int, tokenizer: PreTrainedTokenizerBase
) -> Sample:
    """A demonstrated episode (the first `prompt_length` messages are the prompt) as RL builds
    it (`EpisodeTokens`): the loss on each assistant turn and its end-of-turn (but a turn
    marked `UNTRAINED`), the environment's messages appended as tokens between turns."""
    tokens = EpisodeTokens(tokenizer)
    input_ids = tokens.prompt_ids(messages[:prompt_length])
    loss_mask = [False] * len(input_ids)
    pending: Messages = []  # environment messages since the last assistant turn
    for message in messages[prompt_length:]:
        if message["role"] != "assistant":
            pending.append(message)
            continue
        if pending:
            suffix = tokens.suffix_ids(pending)
            input_ids += suffix
            loss_mask += [False] * len(suffix)
            pending = []
        turn = [*tokenizer(message["content"], add_special_tokens=False)["input_ids"]]
        turn.append(tokens.end_of_turn)
        input_ids += turn
        marked = message.get(UNTRAINED, "false")
        if marked not in ("true", "false"):
            raise ValueError(f'a demonstrated turn has {UNTRAINED}: {marked!r} ("true" or "false")')
        loss_mask += [marked == "false"] * len(turn)
    return Sample(input_ids=input_ids, loss_mask=loss_mask)
