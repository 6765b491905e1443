"""What a model-based reward term is given for one rollout, and the texts made from it.

A single-turn rollout is the example's prompt and a completion string; a multi-turn episode is
the whole conversation (`Messages`), the prompt's messages first. Both become a `ScoreItem`,
the one shape every model term (reward model, judge, plugin) reads. It crosses into a scorer's
process as JSON, never pickled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from asyncrl.envs.base import Example, Messages


@dataclass(frozen=True)
class ScoreItem:
    """One rollout to score: the prompt's messages, the completion (a string, or the model's and
    the environment's messages after the prompt for an episode), the reference answer."""

    prompt: Messages
    completion: str | Messages
    answer: str
    task: str
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, completion: str | Messages, example: Example) -> ScoreItem:
        if isinstance(completion, list):  # an episode: its messages begin with the prompt's
            completion = completion[len(example.prompt) :]
        return cls(list(example.prompt), completion, example.answer, example.task, example.info)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, fields: dict[str, Any]) -> ScoreItem:
        return cls(
            prompt=list(fields["prompt"]),
            completion=fields["completion"],
            answer=str(fields["answer"]),
            task=str(fields["task"]),
            info=dict(fields.get("info") or {}),
        )

    @property
    def task_text(self) -> str:
        """The prompt as a judge reads it: the user's message, or every non-system message as
        `role: content` lines when there are several."""
        shown = [m for m in self.prompt if m.get("role") != "system"]
        if len(shown) == 1:
            return str(shown[0]["content"])
        return conversation_text(shown)

    @property
    def completion_text(self) -> str:
        if isinstance(self.completion, str):
            return self.completion
        return conversation_text(self.completion)

    def conversation(self) -> Messages:
        """Prompt and completion as one conversation (the reward model's chat template input)."""
        if isinstance(self.completion, str):
            return [*self.prompt, {"role": "assistant", "content": self.completion}]
        return [*self.prompt, *self.completion]


def conversation_text(messages: Messages) -> str:
    return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages)
