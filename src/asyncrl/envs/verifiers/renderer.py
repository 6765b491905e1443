"""A `renderers` renderer for chat models whose vocabulary has no tool tokens (SmolLM2, Gemma 3).

verifiers' train client turns a conversation into token ids with a `renderers.Renderer` and
parses each sampled completion back into a message with it. The built-in fallback
(`DefaultRenderer`) finds tool calls only where `<tool_call>` is a single vocabulary token, and
SmolLM2's chat template can neither list tools nor render an assistant message that carries
`tool_calls`. This renderer keeps the model's own chat template and adds what it lacks:

- the tools are listed in the system message, in the text asyncrl's own tool environments use
  (`envs/tools.py`), and an assistant's `tool_calls` are rendered as Hermes
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks after its words;
- `parse_response` reads those blocks from the decoded text, every attempt with its status
  (ok, invalid_json, unclosed_block, missing_name, unknown_tool); a malformed call stays in the
  message's text, so the model sees what it wrote;
- `bridge_to_next_turn` appends the next turn's tokens to the exact ids of the previous prompt
  and completion (`EpisodeTokens.suffix_ids`): a sampled turn is never tokenized again, so a
  tool episode stays one branch, one training sample, and every sampled token is trained as
  it was sampled.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from renderers.base import (
    ParsedResponse,
    ParsedToolCall,
    RenderedTokens,
    ToolCallParseStatus,
)
from renderers.configs import BaseRendererConfig

from asyncrl.envs.episode_tokens import STAND_IN, EpisodeTokens, SuffixError, render_ids
from asyncrl.envs.tools import tools_prompt

BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
IMPORT_PATH = "asyncrl.envs.verifiers.renderer.HermesChatRenderer"


class HermesChatRendererConfig(BaseRendererConfig):
    """No settings of its own: the model's chat template decides the rest."""


def text_of(content: Any) -> str:
    """A message's text: a string as it is, text parts joined (images are refused at start-up:
    the models this renders for read no images)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [
        part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
        for part in content
    ]
    return "".join(part for part in parts if isinstance(part, str))


def call_text(call: dict[str, Any]) -> str:
    """An assistant's tool call as the model writes it."""
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # else kept as written: shown as the model wrote it
            arguments = json.loads(arguments) if arguments else {}
    body = json.dumps({"name": function.get("name"), "arguments": arguments})
    return f"<tool_call>{body}</tool_call>"


def template_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, str]]:
    """The conversation as the chat template takes it: plain role and text, tool calls as
    text, and the tools listed in the system message."""
    out: list[dict[str, str]] = []
    for message in messages:
        text = text_of(message.get("content"))
        if message.get("role") == "assistant" and message.get("tool_calls"):
            text += "".join(call_text(call) for call in message["tool_calls"])
        out.append({"role": message["role"], "content": text})
    if tools:
        listing = tools_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + listing}
        else:
            out.insert(0, {"role": "system", "content": listing})
    return out


class HermesChatRenderer:
    config_class = HermesChatRendererConfig

    def __init__(self, tokenizer: Any, config: HermesChatRendererConfig | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"{getattr(tokenizer, 'name_or_path', 'the model')} has no chat template: "
                "HermesChatRenderer renders with the model's own template"
            )
        self._tokenizer = tokenizer
        self.config = config or HermesChatRendererConfig()
        self._turns = EpisodeTokens(tokenizer)
        self._turns.check()  # a template that cannot append turns is refused at start-up

    @property
    def supports_tools(self) -> bool:
        return True

    @property
    def is_prefix_stable(self) -> bool:
        return False  # the model's template is opaque; turns are bridged, never re-rendered

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> RenderedTokens:
        """The conversation's ids, each attributed to its message (-1: the generation header).
        Attribution renders each prefix once: fine for the short prompts it sees (later turns
        are bridged)."""
        converted = template_messages(messages, tools)
        shift = len(converted) - len(messages)  # a system message added for the tools
        ids: list[int] = []
        indices: list[int] = []
        for end in range(1, len(converted) + 1):
            rendered = render_ids(self._tokenizer, converted[:end], generation_prompt=False)
            owner = end - 1 - shift if end > shift else -1
            indices += [owner] * (len(rendered) - len(ids))
            ids = rendered
        if add_generation_prompt:
            rendered = render_ids(self._tokenizer, converted, generation_prompt=True)
            indices += [-1] * (len(rendered) - len(ids))
            ids = rendered
        return RenderedTokens(
            token_ids=ids,
            message_indices=indices[: len(ids)],
            message_roles=[m.get("role") or "" for m in messages],
        )

    def render_ids(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> list[int]:
        converted = template_messages(messages, tools)
        return render_ids(self._tokenizer, converted, generation_prompt=add_generation_prompt)

    def get_stop_token_ids(self) -> list[int]:
        eos = self._tokenizer.eos_token_id
        stops = [self._turns.end_of_turn]
        return [*stops, eos] if eos is not None and eos not in stops else stops

    def parse_response(
        self,
        token_ids: list[int],
        *,
        tools: list[dict[str, Any]] | None = None,
        prompt_ids: list[int] | None = None,
    ) -> ParsedResponse:
        stops = set(self.get_stop_token_ids())
        ids = list(token_ids)
        while ids and ids[-1] in stops:
            ids.pop()
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        known = {(t.get("function") or {}).get("name") for t in tools or []}
        matches = list(BLOCK.finditer(text))
        calls = [parse_call(match, known if tools else None) for match in matches]
        content = text  # a malformed call stays in the text: the model sees what it wrote
        for match, call in reversed(list(zip(matches, calls, strict=True))):
            if call.status == ToolCallParseStatus.OK:
                content = content[: match.start()] + content[match.end() :]
        return ParsedResponse(content=content.strip() if calls else content, tool_calls=calls)

    def bridge_to_next_turn(
        self,
        previous_prompt_ids: list[int],
        previous_completion_ids: list[int],
        new_messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
    ) -> RenderedTokens | None:
        """The previous ids as they were, the closing of a turn cut by `max_tokens`, then the
        new (tool or user) messages and the generation header as the template renders them."""
        if any(m.get("role") in ("assistant", "system") for m in new_messages):
            return None  # sampled turns are never re-rendered: the caller renders afresh
        previous = list(previous_prompt_ids) + list(previous_completion_ids)
        closing: list[int] = []
        last = previous_completion_ids[-1] if previous_completion_ids else None
        if last not in self.get_stop_token_ids():
            closing, last = [self._turns.end_of_turn], self._turns.end_of_turn
        converted = template_messages(new_messages, None)
        try:
            suffix = self._turns.suffix_ids(converted, turn_end=last)
            indices = self._suffix_attribution(converted, last, len(suffix))
        except SuffixError:
            return None
        ids = previous + closing + suffix
        return RenderedTokens(
            token_ids=ids,
            message_indices=[-1] * (len(previous) + len(closing)) + indices,
            message_roles=[m.get("role") or "" for m in new_messages],
        )

    def _suffix_attribution(
        self, messages: list[dict[str, str]], turn_end: int, total: int
    ) -> list[int]:
        """Which new message each suffix token renders (-1: the turn's closing, the header)."""
        indices: list[int] = []
        done = 0
        head = render_ids(self._tokenizer, STAND_IN, generation_prompt=False)
        closing = len(head) - head[::-1].index(turn_end)
        indices += [-1] * (len(head) - closing)
        done = len(head) - closing
        for end in range(1, len(messages) + 1):
            full = render_ids(
                self._tokenizer, [*STAND_IN, *messages[:end]], generation_prompt=False
            )
            grown = len(full) - closing - done
            indices += [end - 1] * grown
            done += grown
        return indices + [-1] * (total - done)


def parse_call(match: re.Match[str], known: set[Any] | None) -> ParsedToolCall:
    """One `<tool_call>` block and how it parsed (`known`: the request's tool names)."""
    raw, closed = match.group(1), bool(match.group(2))
    if not closed:
        return ParsedToolCall(raw=raw, status=ToolCallParseStatus.UNCLOSED_BLOCK)
    try:
        body = json.loads(raw)
    except ValueError:
        return ParsedToolCall(raw=raw, status=ToolCallParseStatus.INVALID_JSON)
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return ParsedToolCall(raw=raw, status=ToolCallParseStatus.MISSING_NAME)
    arguments = body.get("arguments", {})
    if not isinstance(arguments, dict):
        return ParsedToolCall(
            raw=raw, name=body["name"], status=ToolCallParseStatus.MALFORMED_STRUCTURE
        )
    status = ToolCallParseStatus.OK
    if known is not None and body["name"] not in known:
        status = ToolCallParseStatus.UNKNOWN_TOOL
    return ParsedToolCall(raw=raw, name=body["name"], arguments=arguments, status=status)
