"""`test/tool-turns-env`: a multi-turn tool environment that a model with random weights keeps
playing. Every model turn is taken as a tool call: a turn holding a `<tool_call>` block is run
with the real `calculate` tool, any other is answered with the tool error a malformed call
gets. So each episode has `max_turns` model turns with tool results between them, rendered by
the chat template as tool messages (non-ASCII text included, to exercise byte-level BPE)."""

from __future__ import annotations

from asyncrl.envs.base import Example, Messages, RewardFunction, Split
from asyncrl.envs.calculator import CALCULATE
from asyncrl.envs.multi_turn import Reply
from asyncrl.envs.tools import ToolCallRecord, answer_tool_calls, tool_message, tools_system_prompt

QUESTIONS = ["Berechne 12×34 — mit dem Werkzeug.", "计算 56*78，用工具。", "Calcule 9·87 😀"]


class ToolTurns:
    name = "tool-turns"

    def __init__(self, max_turns: int = 3) -> None:
        self.max_turns = max_turns
        self.rubric = [RewardFunction("turn_letters", self.turn_letters)]

    def examples(self, split: Split, count: int) -> list[Example]:
        system = {"role": "system", "content": tools_system_prompt([CALCULATE])}
        return [
            Example(index, [system, {"role": "user", "content": QUESTIONS[index % 3]}], "", "t")
            for index in range(count)
        ]

    def respond(self, messages: Messages, example: Example) -> Reply:
        answered = answer_tool_calls(messages[-1]["content"], [CALCULATE])
        if answered is None:
            error = "error: no <tool_call> block — schreib einen Aufruf von calculate"
            return Reply([tool_message(error)], tool_calls=[ToolCallRecord("", "no_call")])
        return Reply(answered[0], tool_calls=answered[1])

    def turn_letters(self, messages: Messages, example: Example) -> float:
        """Some spread between episodes (a group with equal rewards has no advantage)."""
        turns = [m["content"] for m in messages if m["role"] == "assistant"]
        return sum(c.isalpha() for c in "".join(turns)) / max(1, len("".join(turns)))


def load_environment(max_turns: int = 3) -> ToolTurns:
    return ToolTurns(max_turns)
