"""Token ids of a multi-turn episode, built by appending, never by re-rendering the conversation.

Re-rendering a conversation with its chat template and tokenizing it again need not give back
the tokens the model produced: templates rewrite earlier turns (reasoning stripped, whitespace
trimmed), and text does not always tokenize back to the same ids. The importance ratios of the
trainer are then computed on tokens the model never sampled. Here an episode's ids are the
prompt's, then each model turn's own ids as the server returned them, then the ids the template
puts after a model turn and before the next one: the rest of the turn's closing (after the
end-of-turn token the model sampled), the environment's messages, and the generation header.
That suffix is rendered on a stand-in conversation, and only if the template renders it as a
clean extension of what came before; otherwise `SuffixError` says so.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from transformers import PreTrainedTokenizerBase

from asyncrl.envs.base import Messages

# a conversation to render suffixes after: its assistant turn stands for any model turn
STAND_IN: Messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}]


class SuffixError(ValueError):
    """The chat template cannot continue a conversation by appending tokens."""


class EpisodeTokens:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = tokenizer.eos_token_id

    @cached_property
    def _stand_in(self) -> list[int]:
        return self.render(STAND_IN, generation_prompt=False)

    def render(self, messages: Messages, generation_prompt: bool) -> list[int]:
        ids: Any = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt
        )
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def prompt_ids(self, messages: Messages) -> list[int]:
        """The first turn's prompt: the example's messages and the generation header."""
        return self.render(messages, generation_prompt=True)

    def suffix_ids(self, messages: Messages, turn_end: int | None = None) -> list[int]:
        """The ids after a model turn that ended with `turn_end` (its last sampled token; the
        tokenizer's EOS by default): the template's closing of that turn, `messages`, and
        the generation header for the next model turn."""
        turn_end = self.end_of_turn if turn_end is None else turn_end
        head = self._stand_in
        full = self.render([*STAND_IN, *messages], generation_prompt=True)
        if full[: len(head)] != head:
            raise SuffixError(
                "the chat template renders a conversation's earlier turns differently once "
                "messages follow them, so a turn cannot be appended as tokens"
            )
        if turn_end not in head:
            raise SuffixError(
                f"the chat template does not close an assistant turn with token {turn_end} "
                f"({self.tokenizer.convert_ids_to_tokens(turn_end)!r}), the token generation "
                "stops on"
            )
        after_turn_end = len(head) - head[::-1].index(turn_end)
        return head[after_turn_end:] + full[len(head) :]

    def check(self) -> None:
        """Raise `SuffixError` at start-up if this template cannot be used turn by turn."""
        self.suffix_ids([{"role": "user", "content": "x"}])
