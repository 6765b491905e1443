"""calculator: a safe arithmetic tool, and episodes that call it then answer."""

from __future__ import annotations

import pytest

from asyncrl.envs.calculator import CalculatorEnv, calculate
from asyncrl.envs.multi_turn import is_multi_turn
from asyncrl.envs.tools import ToolCallRecord


def test_calculate_does_arithmetic_and_nothing_else() -> None:
    assert calculate("4821*7393") == str(4821 * 7393)
    assert calculate("(2 + 3) ** 2 - 7 // 2") == "22"
    assert calculate("1/4") == "0.25"
    for hostile in ["__import__('os').system('true')", "x + 1", "2 ** 1000", "[1] * 9"]:
        with pytest.raises((ValueError, SyntaxError)):
            calculate(hostile)


def test_a_demonstrated_episode_calls_the_tool_then_answers_right() -> None:
    env = CalculatorEnv()
    assert is_multi_turn(env)
    example = env.examples("train", 1)[0]
    episode = env.demonstration(example)
    first_turn = episode[: len(example.prompt) + 1]
    reply = env.respond(first_turn, example)
    assert not reply.done and reply.tool_calls == [ToolCallRecord("calculate", "")]
    assert reply.messages == [episode[len(example.prompt) + 1]]
    assert reply.messages[0]["content"] == example.answer
    assert env.respond(episode, example).done
    assert env.correct(episode, example) == 1.0
    assert env.correct([*episode[:-1], {"role": "assistant", "content": "12"}], example) == 0.0
    assert env.correct(first_turn, example) == 0.0  # a tool call is no answer


def test_the_tools_are_described_in_the_system_prompt_unless_asked_not_to() -> None:
    described = CalculatorEnv().examples("eval", 1)[0].prompt[0]["content"]
    assert '"name": "calculate"' in described and "<tool_call>" in described
    assert CalculatorEnv(describe_tools=False).examples("eval", 1)[0].prompt[0]["content"] == (
        "Use calculate."
    )
