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


def render_ids(
    tokenizer: PreTrainedTokenizerBase, messages: Messages, generation_prompt: bool
) -> list[int]:
    """The chat template's rendering of `messages` as token ids."""
    ids: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def turn_closing_token(tokenizer: PreTrainedTokenizerBase) -> int:
    """The token that closes a model turn: the tokenizer's EOS where the chat template closes an
    assistant turn with it (most chat models), else the first special token the template puts
    after the assistant's words — Gemma 3's instruction-tuned template closes a turn with
    `<end_of_turn>` while its tokenizer's EOS is `<eos>`. Without a template, the EOS."""
    eos = tokenizer.eos_token_id
    if not getattr(tokenizer, "chat_template", None):
        return eos

    header = render_ids(tokenizer, STAND_IN[:1], generation_prompt=True)
    whole = render_ids(tokenizer, STAND_IN, generation_prompt=False)
    if whole[: len(header)] != header:
        return eos  # the template's own oddity: `EpisodeTokens.check` names it
    turn = whole[len(header) :]
    if eos in turn:
        return eos
    added = getattr(tokenizer, "added_tokens_decoder", {})
    special = set(tokenizer.all_special_ids) | {token for token, t in added.items() if t.special}
    return next((token for token in turn if token in special), eos)


class EpisodeTokens:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = turn_closing_token(tokenizer)

    @property
    def stop_token_ids(self) -> list[int]:
        """What a request for a model turn adds to the servers' own stops (the model's EOS
        tokens): the turn's closing token, where it is not the tokenizer's EOS."""
        return [] if self.end_of_turn == self.tokenizer.eos_token_id else [self.end_of_turn]

    @cached_property
    def _stand_in(self) -> list[int]:
        return self.render(STAND_IN, generation_prompt=False)

    def render(self, messages: Messages, generation_prompt: bool) -> list[int]:
        return render_ids(self.tokenizer, messages, generation_prompt)

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
