"""Tools for multi-turn environments: declared with a JSON-schema, called from the model's text,
run in the environment's worker, answered as `tool` messages.

A tool is a Python function with an OpenAI-format description (`name`, `description`,
`parameters` as JSON schema). The tools are listed in the system prompt; a model calls one by
writing a Hermes-style block, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the
parser is pluggable). Every call is answered, a bad one with an error message the model can
read: unparseable, unknown tool, wrong arguments, a tool that raises or runs past its
timeout. The run never sees an exception from a tool; each call and error is counted in the
reply (`ToolCallRecord`) for the orchestrator's metrics.

A turn's calls are bounded: at most `MAX_CALLS_PER_TURN` are run (the rest are answered
`too_many_calls`), and together they get the turn's tool budget (`tool_time_budget`, set by the
reward worker to a share of the turn's timeout): a call is cut at what is left of it, and once
it is spent the remaining calls are answered `out_of_time` unrun. So a short message asking
for many slow calls costs a bounded share of a worker, and the worker is never killed for it.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from asyncrl.envs.base import Messages

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}
RESULT_LIMIT = 2000  # characters of a tool's answer the model is shown
MAX_CALLS_PER_TURN = 8  # tool calls run per model turn; the rest are answered unrun
_turn_deadline: ContextVar[float | None] = ContextVar("tool_turn_deadline", default=None)


@contextmanager
def tool_time_budget(seconds: float | None) -> Iterator[None]:
    """Tool calls made inside share `seconds` of wall time (None: only each tool's timeout)."""
    token = _turn_deadline.set(None if seconds is None else time.monotonic() + seconds)
    try:
        yield
    finally:
        _turn_deadline.reset(token)


def _budget_left() -> float | None:
    deadline = _turn_deadline.get()
    return None if deadline is None else deadline - time.monotonic()


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    function: Callable[..., Any]
    timeout: float = 5.0  # seconds per call

    def schema(self) -> dict[str, Any]:
        """The OpenAI tools format."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


class ToolCallError(ValueError):
    """A call the model wrote that cannot be run; `kind` names the metric it counts in."""

    def __init__(self, kind: str, message: str, tool: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.tool = tool


ToolParser = Callable[[str], list[ToolCall]]  # raises ToolCallError for a malformed call


def parse_hermes(text: str) -> list[ToolCall]:
    """The `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks of `text`."""
    calls = []
    for block in TOOL_CALL.findall(text):
        try:
            call = json.loads(block)
        except ValueError as error:
            raise ToolCallError("unparseable", f"the tool call is not JSON: {error}") from None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            shape = 'a tool call needs {"name": ..., "arguments": {...}}'
            raise ToolCallError("unparseable", shape)
        arguments = call.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ToolCallError("bad_arguments", "arguments must be an object")
        calls.append(ToolCall(call["name"], arguments))
    if not calls and "<tool_call>" in text:
        raise ToolCallError("unparseable", "a <tool_call> block is not closed")
    return calls


def argument_problem(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """Why `arguments` do not fit the tool's schema (required, known, and typed properties)."""
    properties: dict[str, Any] = schema.get("properties", {})
    missing = [name for name in schema.get("required", []) if name not in arguments]
    if missing:
        return f"missing argument {missing[0]!r}"
    unknown = [name for name in arguments if name not in properties]
    if unknown and schema.get("additionalProperties", False) is False:
        return f"unknown argument {unknown[0]!r}"
    for name, value in arguments.items():
        expected = properties.get(name, {}).get("type")
        types = JSON_TYPES.get(expected, (object,)) if isinstance(expected, str) else (object,)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"argument {name!r} must be of type {expected}"
    return None


class ToolTimeout(Exception):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Interrupt Python code running past `seconds` (SIGALRM, so in a main thread only, as in a
    reward worker; a tool blocked inside C code is left to the worker's own timeout, which
    ends the episode)."""

    def expire(signum: int, frame: object) -> None:
        raise ToolTimeout

    if threading.current_thread() is not threading.main_thread():  # no signals here
        yield
        return
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_call(call: ToolCall, tools: dict[str, Tool]) -> str:
    """The tool's answer as text; raises ToolCallError for an unknown tool, bad arguments, a
    tool that raised or ran out of time (its own timeout, or what is left of the turn's)."""
    tool = tools.get(call.name)
    if tool is None:
        message = f"unknown tool {call.name!r:.60}; tools: {', '.join(tools)}"
        raise ToolCallError("unknown_tool", message)  # not named: the model may write anything
    problem = argument_problem(tool.parameters, call.arguments)
    if problem is not None:
        raise ToolCallError("bad_arguments", problem, call.name)
    left = _budget_left()
    if left is not None and left <= 0:
        message = "the turn's time for tools is spent; this call was not run"
        raise ToolCallError("out_of_time", message, call.name)
    seconds = tool.timeout if left is None else min(tool.timeout, left)
    try:
        with time_limit(seconds):
            result = tool.function(**call.arguments)
    except ToolTimeout:
        message = f"{call.name} took over {seconds:.3g} s"
        raise ToolCallError("timeout", message, call.name) from None
    except Exception as error:  # the tool's own failure is an answer the model can read
        raise ToolCallError("raised", f"{type(error).__name__}: {error}", call.name) from None
    text = result if isinstance(result, str) else json.dumps(result)
    return text[:RESULT_LIMIT]


@dataclass(frozen=True)
class ToolCallRecord:
    tool: str  # "" when the call names no known tool
    error: str  # "" for a call that ran, else its kind


def answer_tool_calls(
    text: str,
    tools: list[Tool],
    parser: ToolParser = parse_hermes,
    max_calls: int = MAX_CALLS_PER_TURN,
) -> tuple[Messages, list[ToolCallRecord]] | None:
    """`tool` messages answering every call in the model's `text` (the first `max_calls` run,
    the rest refused), and a record of each; None when the text calls no tool (the model has
    answered)."""
    by_name = {tool.name: tool for tool in tools}
    try:
        calls = parser(text)
    except ToolCallError as error:
        return [tool_message(f"error: {error}")], [ToolCallRecord(error.tool, error.kind)]
    if not calls:
        return None
    messages, records = [], []
    for number, call in enumerate(calls):
        if number >= max_calls:
            messages.append(tool_message(f"error: only {max_calls} tool calls are run per turn"))
            records.append(ToolCallRecord(call.name if call.name in by_name else "",
                                          "too_many_calls"))  # fmt: skip
            continue
        try:
            messages.append(tool_message(run_call(call, by_name)))
            records.append(ToolCallRecord(call.name, ""))
        except ToolCallError as error:
            messages.append(tool_message(f"error: {error}"))
            records.append(ToolCallRecord(error.tool, error.kind))
    return messages, records


def tool_message(content: str) -> dict[str, str]:
    return {"role": "tool", "content": content}


def tools_system_prompt(tools: list[Tool]) -> str:
    """The tools and how to call them, for templates that have no tools section of their own."""
    return tools_prompt([tool.schema() for tool in tools])


def tools_prompt(schemas: list[dict[str, Any]]) -> str:
    """`tools_system_prompt` of tools given in the OpenAI format (a verifiers environment's)."""
    listed = "\n".join(json.dumps(schema) for schema in schemas)
    return (
        "You may call tools. Available tools:\n<tools>\n" + listed + "\n</tools>\n"
        'To call one, write <tool_call>{"name": <tool name>, "arguments": <object>}</tool_call>.'
    )
