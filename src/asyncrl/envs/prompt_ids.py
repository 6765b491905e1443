"""What a pre-tokenized prompt (`Example.prompt_token_ids`, a JSONL line's `input_token_ids`)
must be before it is sent: a non-empty list of token ids, each a whole number in
[0, vocabulary size), short enough to leave room for the completion within `seq_len`.

An example that breaks this is refused where it is read, naming its source (file:line, or the
env-server and the example's place in its answer): sent, it would be refused by the server at
the moment it is drawn, not at start-up; a string would have been sent as a raw text prompt.
"""

from __future__ import annotations

from collections.abc import Sequence


def shape_problem(ids: object) -> str | None:
    """Why `ids` is no list of token ids (None when it is one): checkable without a tokenizer."""
    if ids is None:
        return "`input_token_ids` is null (leave the key out to prompt with text)"
    if isinstance(ids, str):
        return "`input_token_ids` is a string, not a list of token ids"
    if not isinstance(ids, list):
        return f"`input_token_ids` is a {type(ids).__name__}, not a list of token ids"
    if not ids:
        return "`input_token_ids` is empty"
    for position, value in enumerate(ids):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"`input_token_ids[{position}]` is {value!r:.40}, not a whole number"
        if value < 0:
            return f"`input_token_ids[{position}]` is {value}, a negative token id"
    return None


def limit_problem(
    ids: Sequence[int], vocab_size: int, seq_len: int, max_tokens: int | None
) -> str | None:
    """Why the model cannot take `ids` (None when it can): an id beyond its vocabulary, or a
    prompt that leaves less than `max_tokens` (at least one) within `seq_len`."""
    for position, value in enumerate(ids):
        if value >= vocab_size:
            return (
                f"`input_token_ids[{position}]` is {value}, outside the tokenizer's vocabulary "
                f"of {vocab_size}"
            )
    room = max_tokens or 1
    if len(ids) + room > seq_len:
        asked = f"max_tokens {max_tokens}" if max_tokens else "one completion token"
        return (
            f"the prompt's {len(ids)} tokens and {asked} exceed seq_len {seq_len} "
            "(a longer sample cannot be trained on)"
        )
    return None
