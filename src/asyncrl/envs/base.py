"""What every environment provides: examples to prompt with, and a reward for a completion."""

from __future__ import annotations

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


class Environment(Protocol):
    name: str

    def examples(self, split: Split, count: int) -> list[Example]:
        """`count` deterministic examples of `split`; train and eval never share a prompt."""
        ...

    def reward(self, completion: str, example: Example) -> float:
        """Reward in [0, 1] of one completion (the text the model produced, template removed)."""
        ...
