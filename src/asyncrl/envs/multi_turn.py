"""What a multi-turn environment provides beyond a single-turn one: an answer to each model turn.

An episode starts from the example's messages. After every model turn the environment sees the
whole conversation so far (the model's turns as `assistant` messages) and answers with new
messages, or says the episode is over. It keeps no state between calls: everything it needs is
in the example and the conversation, so any worker process (or a remote one) can answer any
turn. The rubric scores the finished episode: each term is `function(messages, example)`, the
messages being the whole conversation, the model's turns included. For process supervision
(`advantage.type: process`) it may also give `step_rewards(messages, example)`: (model turn
index, reward) pairs, one step ending at each turn it judges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard, runtime_checkable

from asyncrl.envs.base import Example, Messages, RewardFunction, Split
from asyncrl.envs.tools import ToolCallRecord

# a demonstrated assistant turn marked `{UNTRAINED: "true"}` is shown to `asyncrl sft` but not
# trained on: a mistake the demonstration then recovers from (the recovery is trained on)
UNTRAINED = "untrained"


@dataclass(frozen=True)
class Reply:
    """The environment's answer to a model turn: messages to append, and whether it is over."""

    messages: Messages = field(default_factory=list)
    done: bool = False
    tool_calls: list[ToolCallRecord] = field(default_factory=list)  # for the metrics


@runtime_checkable
class MultiTurnEnvironment(Protocol):
    name: str
    rubric: list[RewardFunction]  # each term: function(messages, example) -> float
    max_turns: int  # model turns per episode at most

    def examples(self, split: Split, count: int) -> list[Example]: ...

    def respond(self, messages: Messages, example: Example) -> Reply:
        """The answer to the last (assistant) message of `messages`."""
        ...


def is_multi_turn(env: Any) -> TypeGuard[MultiTurnEnvironment]:
    return isinstance(env, MultiTurnEnvironment)


def reply_problems(reply: Any) -> str | None:
    """Why an environment's answer is not a usable `Reply` (None when it is)."""
    if not isinstance(reply, Reply):
        return f"respond returned {type(reply).__name__}, not a Reply"
    for message in reply.messages:
        if not (isinstance(message, dict) and isinstance(message.get("content"), str)):
            return f"a reply message is not a dict with string content: {message!r:.200}"
        if message.get("role") not in ("user", "tool", "system"):
            return f"a reply message has role {message.get('role')!r} (user, tool or system)"
    if not all(isinstance(record, ToolCallRecord) for record in reply.tool_calls):
        return "tool_calls must be ToolCallRecord entries"
    if not reply.done and not reply.messages:
        return "respond gave no messages and did not end the episode"
    return None
