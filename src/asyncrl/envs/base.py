"""What every environment provides: examples to prompt with, and a reward for a completion."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Split = Literal["train", "eval"]
Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Example:
    """One prompt; `prompt` is chat messages (the chat template is applied by the caller)."""

    example_id: int
    prompt: Messages
    answer: str
    task: str
    info: dict[str, Any] = field(default_factory=dict)
    prompt_token_ids: list[int] | None = None  # a pre-tokenized prompt, sent as token ids
    source: str | None = None  # where it was read (`file:line`), for messages that name it
    # a base model's prompt (`plain_prompt.py`): text sent to the completions route as is
    prompt_text: str | None = None
    # the strings that end its completion, and whether the completion keeps the one it ended at
    # (vLLM's `include_stop_str_in_output`): an answer's closing tag is kept for its scorer
    stop: tuple[str, ...] = ()
    stop_kept: bool = False


EVAL_BUCKETS = 8  # one generated problem in eight (by hash) belongs to the held-out split


def split_of(key: str) -> Split:
    """Train/eval membership decided by the problem itself, so the splits never overlap."""
    return "eval" if zlib.crc32(key.encode()) % EVAL_BUCKETS == 0 else "train"


@dataclass(frozen=True)
class RewardFunction:
    """One term of a rubric: `function(completion, example) -> float`, weighted in the sum.
    A multi-turn environment's terms get the episode's messages instead of a completion."""

    name: str
    function: Callable[[Any, Example], float]
    weight: float = 1.0


class Environment(Protocol):
    name: str
    rubric: list[RewardFunction]

    def examples(self, split: Split, count: int) -> list[Example]:
        """`count` deterministic examples of `split`; train and eval never share a problem (a
        game whose prompt hides its answer may share prompts: it holds out its draws)."""
        ...


def rubric_reward(values: dict[str, float], rubric: list[RewardFunction]) -> float:
    """Σ weight × value over the rubric (a missing value counts as 0)."""
    return sum(term.weight * values.get(term.name, 0.0) for term in rubric)


def score(env: Environment, completion: str | Messages, example: Example) -> float:
    """The rubric reward of one completion (of a multi-turn episode: its messages), in this
    process (evaluation, tests)."""
    values = {term.name: float(term.function(completion, example)) for term in env.rubric}
    return rubric_reward(values, env.rubric)
