"""asyncrl's chat harness for verifiers environments: the model, its MCP tools, in a loop.

A verifiers harness is the program that plays an agent's seat: it talks to the model through
the rollout's interception server and runs the model's tool calls. verifiers' tool-using chat
loop (`null`) is a separate program run through `uv` (its dependencies fetched from the package
index on first use) and started again for every user turn. verifiers' harness contract allows
the loop to run in-process instead ("the interception is the contract, not the process"), and
that is what this one does, in the worker that runs the episode:

- the task's system prompt and prompt (text or messages) open the conversation; a resumed
  exchange (a user turn, an OpenEnv observation) goes on from the whole conversation;
- each model turn is one chat request to the interception endpoint, with the task's MCP tools
  listed (named `<server>_<tool>`, as verifiers names them);
- a reply without tool calls ends the segment; otherwise every call is answered by a `tool`
  message: the tool's text (cut at `RESULT_LIMIT` characters), or an error the model can read
  (arguments that are not a JSON object, an unknown tool, a tool that failed or ran past
  `tool_timeout`). At most `MAX_CALLS_PER_TURN` calls of a turn are run; the rest are answered
  unrun;
- a request the interception refuses because the conversation no longer fits (400) ends the
  segment as the context's end, as verifiers' own loop does; any other refusal ends it as a
  failure, whose cause the rollout records.

Select it as `harness: {id: asyncrl-chat}`; it is asyncrl's default for a seat whose environment
pins no harness (verifiers' own default, `bash`, runs model-written shell commands on the host).
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from typing import Any

import httpx
from verifiers.v1.clients import ModelContext
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harness import Harness
from verifiers.v1.runtimes import ProgramResult, Runtime
from verifiers.v1.task import TaskData
from verifiers.v1.trace import Trace

from asyncrl.envs.tools import MAX_CALLS_PER_TURN, RESULT_LIMIT

HARNESS_ID = "asyncrl-chat"
OVERLONG = "maximum context length"  # renderers' words for a prompt that no longer fits


class ChatHarnessConfig(HarnessConfig):
    id: str = HARNESS_ID


class ChatHarness(Harness[ChatHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True
    SUPPORTS_TOOL_INTERCEPTION = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: ModelContext,
        trace: Trace,
        runtime: Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: TaskData,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages += [message_to_wire(message) for message in prompt]
        headers = {"Authorization": f"Bearer {secret}"}
        async with AsyncExitStack() as stack:
            http = await stack.enter_async_context(httpx.AsyncClient(timeout=None))
            tools = await Tools.connect(mcp_urls, stack, self.config.tool_timeout)
            while True:
                body: dict[str, Any] = {"model": ctx.model, "messages": messages}
                if tools.schemas:
                    body["tools"] = tools.schemas
                response = await http.post(
                    f"{endpoint}/chat/completions", json=body, headers=headers
                )
                if response.status_code != 200:
                    ended = response.status_code == 400 and OVERLONG in response.text
                    return ProgramResult(
                        exit_code=0 if ended else 1, stdout="", stderr=response.text[-2000:]
                    )
                message = response.json()["choices"][0]["message"]
                messages.append(message)
                calls = message.get("tool_calls") or []
                if not calls:
                    return ProgramResult(
                        exit_code=0, stdout=message.get("content") or "", stderr=""
                    )
                for number, call in enumerate(calls):
                    answer = await self.answer(
                        call, number, tools, http, tool_interception_url, secret
                    )
                    if answer is None:  # the rollout stopped it
                        return ProgramResult(exit_code=0, stdout="", stderr="")
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": call.get("id", ""),
                            "name": call["function"]["name"],
                            "content": answer,
                        }
                    )

    async def answer(
        self,
        call: dict[str, Any],
        number: int,
        tools: Tools,
        http: httpx.AsyncClient,
        gate_url: str | None,
        secret: str,
    ) -> str | None:
        """The text a `tool` message answers `call` with; None when the rollout stops."""
        function = call.get("function") or {}
        name = function.get("name", "")
        if number >= MAX_CALLS_PER_TURN:
            return f"error: only {MAX_CALLS_PER_TURN} tool calls are run per turn"
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError as error:
            return f"error: the arguments are not JSON ({error})"
        if not isinstance(arguments, dict):
            return "error: the arguments must be a JSON object"
        if gate_url:  # the rollout's own policy may deny or stop a call before it runs
            decision = (
                await http.post(
                    gate_url,
                    headers={"Authorization": f"Bearer {secret}"},
                    json={"tool_call_id": call.get("id"), "name": name, "arguments": arguments},
                )
            ).json()
            if decision.get("action") == "stop":
                return None
            if decision.get("action") == "deny":
                return str((decision.get("message") or {}).get("content", "denied"))[:RESULT_LIMIT]
        return (await tools.call(name, arguments))[:RESULT_LIMIT]


class Tools:
    """The rollout's MCP servers: their tools' schemas, and calls to them."""

    def __init__(self, timeout: float) -> None:
        self.schemas: list[dict[str, Any]] = []
        self.route: dict[str, tuple[Any, str]] = {}  # listed name -> (client, tool)
        self.timeout = timeout

    @classmethod
    async def connect(cls, urls: dict[str, str], stack: AsyncExitStack, timeout: float) -> Tools:
        from mcp import Client

        tools = cls(timeout)
        for server, url in urls.items():
            client = await stack.enter_async_context(Client(url, read_timeout_seconds=timeout))
            for tool in (await client.list_tools()).tools:
                name = f"{server}_{tool.name}" if server else tool.name
                tools.route[name] = (client, tool.name)
                tools.schemas.append(
                    {
                        "type": "function",
                        "function": {
                            "name": name,
                            "description": tool.description or "",
                            "parameters": tool.input_schema,
                        },
                    }
                )
        return tools

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        if name not in self.route:
            return f"error: unknown tool {name!r:.80}; tools: {', '.join(self.route)}"
        client, tool = self.route[name]
        try:
            result = await asyncio.wait_for(client.call_tool(tool, arguments), self.timeout)
        except TimeoutError:
            return f"error: {name} took over {self.timeout:g} s"
        except Exception as error:  # the tool's server failed: an answer the model can read
            return f"error: {name} failed: {type(error).__name__}: {error}"
        text = "\n".join(getattr(block, "text", None) or str(block) for block in result.content)
        return f"error: {text}" if result.is_error else text
