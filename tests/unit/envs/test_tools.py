"""Tool calls: every bad call is answered with an error the model can read and counted by kind;
a good call runs and its result comes back as a `tool` message."""

from __future__ import annotations

import time

import pytest

from asyncrl.envs.tools import Tool, ToolCallRecord, answer_tool_calls, parse_hermes

ADD = Tool(
    name="add",
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
    function=lambda a, b: a + b,
)


def sleep_forever() -> str:
    time.sleep(30)
    return "never"


def fail() -> str:
    raise RuntimeError("disk full")


NO_ARGUMENTS = {"type": "object", "properties": {}}
TOOLS = [
    ADD,
    Tool("slow", "Sleeps.", NO_ARGUMENTS, sleep_forever, timeout=0.2),
    Tool("broken", "Fails.", NO_ARGUMENTS, fail),
]


def call(body: str) -> str:
    return f"let me see <tool_call>{body}</tool_call>"


def add(arguments: str) -> str:
    return call('{"name": "add", "arguments": ' + arguments + "}")


def test_a_good_call_runs_and_answers_as_a_tool_message() -> None:
    messages, records = answer_tool_calls(add('{"a": 2, "b": 40}'), TOOLS)
    assert messages == [{"role": "tool", "content": "42"}]
    assert records == [ToolCallRecord("add", "")]


def test_text_without_a_call_is_an_answer() -> None:
    assert answer_tool_calls("it is 42", TOOLS) is None


@pytest.mark.parametrize(
    ("text", "tool", "kind", "says"),
    [
        (call('{"name": "add", "arguments": {"a": 2,'), "", "unparseable", "not JSON"),
        ("<tool_call>{\"name\": \"add\"", "", "unparseable", "not closed"),
        (call('{"arguments": {}}'), "", "unparseable", "needs"),
        (call('{"name": "add", "arguments": [1, 2]}'), "", "bad_arguments", "must be an object"),
        (call('{"name": "rm", "arguments": {}}'), "", "unknown_tool", "unknown tool 'rm'"),
        (add('{"a": 2}'), "add", "bad_arguments", "missing argument 'b'"),
        (add('{"a": 2, "b": "x"}'), "add", "bad_arguments", "type integer"),
        (add('{"a": true, "b": 1}'), "add", "bad_arguments", "type integer"),
        (add('{"a": 1, "b": 1, "c": 1}'), "add", "bad_arguments", "unknown argument 'c'"),
        (call('{"name": "slow", "arguments": {}}'), "slow", "timeout", "took over 0.2 s"),
        (call('{"name": "broken"}'), "broken", "raised", "RuntimeError: disk full"),
    ],
)  # fmt: skip
def test_a_bad_call_is_answered_with_its_error_and_counted(text, tool, kind, says) -> None:
    started = time.monotonic()
    messages, records = answer_tool_calls(text, TOOLS)
    assert time.monotonic() - started < 5
    assert records == [ToolCallRecord(tool, kind)]
    assert messages[0]["role"] == "tool" and messages[0]["content"].startswith("error: ")
    assert says in messages[0]["content"]


def test_several_calls_in_one_turn_are_each_answered() -> None:
    text = add('{"a": 1, "b": 2}') + call('{"name": "nope"}')
    messages, records = answer_tool_calls(text, TOOLS)
    assert messages[0]["content"] == "3"
    assert records == [ToolCallRecord("add", ""), ToolCallRecord("", "unknown_tool")]


def test_the_parser_is_pluggable() -> None:
    def bracket_parser(text: str):
        return parse_hermes(text.replace("[[", "<tool_call>").replace("]]", "</tool_call>"))

    text = '[[{"name": "add", "arguments": {"a": 1, "b": 1}}]]'
    assert answer_tool_calls(text, TOOLS) is None
    assert answer_tool_calls(text, TOOLS, bracket_parser)[0] == [{"role": "tool", "content": "2"}]


def test_calls_beyond_the_turns_limit_are_answered_unrun() -> None:
    ran = []
    counting = Tool("count", "Counts.", NO_ARGUMENTS, lambda: ran.append(1) or len(ran))
    text = " ".join(call('{"name": "count", "arguments": {}}') for _ in range(12))
    messages, records = answer_tool_calls(text, [counting])
    assert len(ran) == 8 and len(messages) == 12
    assert [r.error for r in records] == [""] * 8 + ["too_many_calls"] * 4
    assert "only 8 tool calls are run per turn" in messages[-1]["content"]


def test_a_turns_slow_calls_share_its_tool_budget() -> None:
    from asyncrl.envs.tools import tool_time_budget

    slow = Tool("nap", "Sleeps 5 s.", NO_ARGUMENTS, lambda: time.sleep(5) or "rested", timeout=5)
    text = " ".join(call('{"name": "nap", "arguments": {}}') for _ in range(4))
    started = time.monotonic()
    with tool_time_budget(1.0):
        _, records = answer_tool_calls(text, [slow])
    assert time.monotonic() - started < 2.0  # not 4 × 5 s
    assert [r.error for r in records] == ["timeout", "out_of_time", "out_of_time", "out_of_time"]
