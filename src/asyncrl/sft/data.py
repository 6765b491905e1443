"""Turn an environment's (prompt, answer) pairs into chat-formatted training samples."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from asyncrl.envs import Example
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
