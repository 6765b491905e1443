"""calculator: a safe arithmetic tool, and episodes that call it then answer."""

from __future__ import annotations

import pytest

from asyncrl.envs.calculator import CalculatorEnv, calculate
from asyncrl.envs.multi_turn import UNTRAINED, is_multi_turn
from asyncrl.envs.reward_worker import score
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


def test_a_retry_demonstration_replays_a_real_error_then_the_right_call() -> None:
    """The slipped call's error is the one the environment gives; the episode is judged right,
    its first turn wrong; with retry_demos 0 or 1, no or every demonstration has one."""
    env = CalculatorEnv(retry_demos=0.5, min_digits=3, max_digits=3)
    examples = env.examples("train", 40)
    episodes = [env.demonstration(example) for example in examples]
    retried = [
        (e, x) for e, x in zip(episodes, examples, strict=True) if len(e) > len(x.prompt) + 3
    ]
    assert 10 <= len(retried) <= 30
    for episode, example in retried:
        start = len(example.prompt)
        slipped, error = episode[start], episode[start + 1]
        assert slipped[UNTRAINED] == "true" and UNTRAINED not in episode[start + 2]
        reply = env.respond(episode[: start + 1], example)
        assert reply.messages == [error] and reply.tool_calls[0].error
        assert env.respond(episode, example).done and env.correct(episode, example) == 1.0
        assert env.step_rewards(episode, example) == [(0, 0.0), (1, 1.0), (2, 1.0)]
    assert env.demonstration(examples[0]) == episodes[0]  # the same slip every time
    never, always = CalculatorEnv(retry_demos=0.0), CalculatorEnv(retry_demos=1.0)
    assert all(len(never.demonstration(x)) == len(x.prompt) + 3 for x in examples)
    assert all(len(always.demonstration(x)) == len(x.prompt) + 5 for x in examples)


def test_the_tools_are_described_in_the_system_prompt_unless_asked_not_to() -> None:
    described = CalculatorEnv().examples("eval", 1)[0].prompt[0]["content"]
    assert '"name": "calculate"' in described and "<tool_call>" in described
    assert CalculatorEnv(describe_tools=False).examples("eval", 1)[0].prompt[0]["content"] == (
        "Use calculate."
    )


def test_factors_have_the_digits_asked() -> None:
    for example in CalculatorEnv(min_digits=2, max_digits=3).examples("train", 200):
        a, b = example.info["expression"].split("*")
        assert 2 <= len(a) <= 3 and 2 <= len(b) <= 3
    lengths = {len(e.info["expression"]) for e in CalculatorEnv().examples("train", 200)}
    assert lengths == {7, 8, 9}  # 3 or 4 digits each


def test_each_turn_is_judged_on_its_own_for_process_supervision() -> None:
    env = CalculatorEnv()
    example = env.examples("train", 1)[0]
    a = example.info["expression"].split("*")[0]
    episode = env.demonstration(example)
    assert env.step_rewards(episode, example) == [(0, 1.0), (1, 1.0)]
    call, result, answer = episode[len(example.prompt) :]
    wrong_call = {"role": "assistant", "content": call["content"].replace(a, str(int(a) + 1))}
    copied = [*example.prompt, wrong_call, {**result, "content": "123"}]
    copied.append({**answer, "content": "123"})
    assert env.step_rewards(copied, example) == [(0, 0.0), (1, 1.0)]  # a faithful copy
    miscopied = [*episode[:-1], {**answer, "content": "12"}]
    assert env.step_rewards(miscopied, example) == [(0, 1.0), (1, 0.0)]
    garbled = [*example.prompt, {"role": "assistant", "content": "<tool_call>{oops</tool_call>"}]
    assert env.step_rewards(garbled, example) == [(0, 0.0)]
    unaided = [*example.prompt, {"role": "assistant", "content": example.answer}]
    assert env.step_rewards(unaided, example) == [(0, 1.0)]  # no call: judged on the product


def test_the_reward_worker_refuses_a_step_naming_a_turn_the_episode_lacks() -> None:
    class Misnumbered(CalculatorEnv):
        def step_rewards(self, messages, example):  # type: ignore[no-untyped-def]
            return [(len(super().step_rewards(messages, example)), 1.0)]

    env = Misnumbered()
    example = env.examples("train", 1)[0]
    task = {"messages": env.demonstration(example), "steps": True}
    answer = score(env, task, example)
    assert answer["steps"] == [] and "turn outside 0..1" in answer["errors"]["step_rewards"]
    assert answer["values"] == {"correct": 1.0}  # the outcome is still scored
