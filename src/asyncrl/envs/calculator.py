"""`calculator`: products of large numbers, exact only with the `calculate` tool.

A tool task a tiny model can learn on a CPU: it cannot multiply 4-digit numbers in its head, but
it can learn to write `<tool_call>{"name": "calculate", "arguments": {"expression": "a*b"}}
</tool_call>` and copy the tool's answer. An episode ends at the first model turn that calls no
tool; the reward is 1 when that answer is the exact product. For process supervision each turn
is judged on its own (`step_rewards`): a call on the asked expression, an answer that copies the
tool's result.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re

from asyncrl.envs.base import Example, Messages, RewardFunction, Split, split_of
from asyncrl.envs.multi_turn import UNTRAINED, Reply
from asyncrl.envs.tools import (
    Tool,
    ToolCallError,
    answer_tool_calls,
    parse_hermes,
    tool_message,
    tools_system_prompt,
)

NUMBER = re.compile(r"-?\d+")
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
MAX_EXPONENT = 64


def calculate(expression: str) -> str:
    """Evaluate + - * / // % ** and parentheses on numbers; nothing else is accepted."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent above {MAX_EXPONENT}")
            return OPERATORS[type(node.op)](left, right)
        raise ValueError(f"not arithmetic: {ast.dump(node)[:80]}")

    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    result = value(ast.parse(expression, mode="eval").body)
    return str(int(result)) if float(result).is_integer() else repr(result)


CALCULATE = Tool(
    name="calculate",
    description="Evaluate an arithmetic expression.",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
    function=calculate,
)


class CalculatorEnv:
    name = "calculator"

    def __init__(
        self, seed: int = 0, min_digits: int = 3, max_digits: int = 4, max_turns: int = 3,
        describe_tools: bool = True, retry_demos: float = 0.0,
    ) -> None:  # fmt: skip
        """`describe_tools: false` leaves the tool list out of the system prompt (a tiny model
        learns the call from the warm-up and reads 300 fewer tokens). `retry_demos`: the
        fraction of warm-up episodes that start with a malformed call (not trained on), its
        error, then the right call: a model that never saw an error does not retry after one."""
        if not 1 <= min_digits <= max_digits:
            raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
        if not 0 <= retry_demos <= 1:
            raise ValueError(f"retry_demos is a fraction in [0, 1], got {retry_demos}")
        self.retry_demos = retry_demos
        self.seed = seed
        self.min_digits = min_digits
        self.max_digits = max_digits
        self.max_turns = max_turns
        self.tools = [CALCULATE]
        self.system_prompt = tools_system_prompt(self.tools) if describe_tools else "Use calculate."
        self.rubric = [RewardFunction("correct", self.correct)]

    def examples(self, split: Split, count: int) -> list[Example]:
        rng = random.Random(f"calculator:{self.seed}:{split}")
        examples: list[Example] = []
        while len(examples) < count:
            digits = (rng.randint(self.min_digits, self.max_digits) for _ in range(2))
            a, b = (rng.randint(10 ** (d - 1), 10**d - 1) for d in digits)
            if split_of(f"{a}*{b}") != split:
                continue
            examples.append(
                Example(
                    example_id=len(examples),
                    prompt=[
                        {"role": "system", "content": self.system_prompt},
                        {"role": "user", "content": f"{a}*{b}=?"},
                    ],
                    answer=str(a * b),
                    task=self.name,
                    info={"expression": f"{a}*{b}"},
                )
            )
        return examples

    def respond(self, messages: Messages, example: Example) -> Reply:
        answered = answer_tool_calls(messages[-1]["content"], self.tools)
        if answered is None:  # no tool call: the model has answered
            return Reply(done=True)
        tool_messages, records = answered
        return Reply(tool_messages, tool_calls=records)

    def correct(self, messages: Messages, example: Example) -> float:
        final = messages[-1]
        if final["role"] != "assistant" or "<tool_call>" in final["content"]:
            return 0.0
        return float(number_in(final["content"]) == example.answer)

    def step_rewards(self, messages: Messages, example: Example) -> list[tuple[int, float]]:
        """One step per model turn: 1 for a call of `calculate` on the asked expression, or for
        an answer holding the last tool result (the product, when no tool was called)."""
        steps, result = [], example.answer
        for message in messages[len(example.prompt) :]:
            if message["role"] == "tool":
                result = message["content"].strip()
            elif message["role"] == "assistant":
                text = message["content"]
                asked = call_asks(text, example.info["expression"])
                right = asked if "<tool_call>" in text else number_in(text) == result
                steps.append((len(steps), float(right)))
        return steps

    def demonstration(self, example: Example) -> Messages:
        """Call the tool, then answer with its result (the supervised warm-up); for a
        `retry_demos` share of examples, a malformed call and its error come first."""
        expression = example.info["expression"]
        call = {"name": "calculate", "arguments": {"expression": expression}}
        text = f"<tool_call>{json.dumps(call)}</tool_call>"
        rng = random.Random(f"calculator-demo:{self.seed}:{expression}")
        mistake: Messages = []
        if rng.random() < self.retry_demos:
            slipped, error = self.malformed(text, rng)
            mistake = [{"role": "assistant", "content": slipped, UNTRAINED: "true"}, error]
        return [
            *example.prompt,
            *mistake,
            {"role": "assistant", "content": text},
            tool_message(calculate(expression)),
            {"role": "assistant", "content": example.answer},
        ]

    def malformed(self, call: str, rng: random.Random) -> tuple[str, dict[str, str]]:
        """`call` with one character of its JSON dropped, such that the tool answers with an
        error (not a wrong product), and that error message."""
        positions = list(range(len("<tool_call>"), len(call) - len("</tool_call>")))
        rng.shuffle(positions)
        for position in positions:
            slipped = call[:position] + call[position + 1 :]
            answered = answer_tool_calls(slipped, self.tools)
            if answered is not None and answered[1][0].error:
                return slipped, answered[0][0]
        raise ValueError(f"no dropped character makes {call!r} an error")  # `{` always does


def call_asks(text: str, expression: str) -> bool:
    """`text` is one call of `calculate` on `expression` (spaces aside)."""
    try:
        calls = parse_hermes(text)
    except ToolCallError:
        return False
    if len(calls) != 1 or calls[0].name != "calculate":
        return False
    asked = calls[0].arguments.get("expression")
    return isinstance(asked, str) and asked.replace(" ", "") == expression


def number_in(text: str) -> str | None:
    match = NUMBER.search(text)
    return match.group() if match else None


def load_environment(**kwargs: object) -> CalculatorEnv:
    return CalculatorEnv(**kwargs)  # type: ignore[arg-type]
