"""Bad input costs one episode, never the run. `faulty-v1` (`fixtures/`) has a task for each way
an environment goes wrong; each is played by the same pool of workers, one after the other, and
the pool still plays the next one. Each failure is counted by its reason, its episode scores 0
and is not trained on. Tools that go wrong (`fixtures/faulty_tools.py`, a real MCP server) are
answered with text the model can read; a tool call the model writes in a broken format is
counted by how it is broken."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from tests.integration.verifiers.helpers import play

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAULTS = {  # task -> the reason its episode fails for (None: it does not fail)
    "raise": "EnvError", "hang": "timeout", "loop": "timeout", "malformed": "EnvError",
    "missing_field": "TaskError", "flood": None, "ok": None, "block": "worker_hung",
}  # fmt: skip
# played together, as the orchestrator plays groups, then `block` alone: its worker is killed,
# and with it every episode it was playing
ROUNDS = [[task for task in FAULTS if task != "block"], ["block"]]


def test_each_faulty_environment_costs_its_episode_and_is_counted_by_reason(
    smollm2_dir: Path, smollm2_server: str, verifiers_fixtures: Path
) -> None:
    settings = {"episode_timeout": 30.0, "hang_seconds": 8.0, "train_select": {}}
    env = {"id": "faulty-v1", "verifiers": settings}
    played = play(smollm2_dir, smollm2_server, env, rounds=ROUNDS, rollouts=1,
                  sampling={"max_tokens": 8, "temperature": 1.0})  # fmt: skip
    for task, group in zip(FAULTS, played.groups, strict=True):
        reason = FAULTS[task]
        (sample,) = group.samples
        ended = next(iter(group.episode_ends))
        if reason is None:
            assert ended in ("done", "budget"), (task, group.episode_ends)
            assert any(sample.completion_mask), task
        else:
            assert ended == f"env_{reason}", (task, group.episode_ends)
            assert group.rewards == [0.0] and not any(sample.completion_mask), task
    failures = played.pool.failures
    expected = {"EnvError": 2, "timeout": 2, "worker_hung": 1, "TaskError": 1, "output_flood": 1}
    assert {k: failures[k] for k in expected} == expected, failures
    assert played.metrics["orchestrator/verifiers/faulty-v1/failed/timeout"] == 2


def test_tools_that_raise_hang_or_flood_are_answered_with_text(verifiers_fixtures: Path) -> None:
    from asyncrl.envs.tools import RESULT_LIMIT
    from asyncrl.envs.verifiers.chat_harness import Tools

    port_file = Path(f"/tmp/asyncrl-faulty-tools-{os.getpid()}")
    env = os.environ | {"VF_CONFIG": "{}", "MCP_PORT_FILE": str(port_file)}
    server = subprocess.Popen([sys.executable, "-m", "faulty_tools"], env=env,
                              start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300  # a loaded machine: minutes
        while not port_file.exists() or not port_file.read_text().strip():
            assert server.poll() is None and time.monotonic() < deadline, "no tool server"
            time.sleep(0.2)
        url = f"http://127.0.0.1:{port_file.read_text().strip()}/mcp"

        async def calls() -> dict[str, str]:
            async with AsyncExitStack() as stack:
                for _ in range(100):  # until it serves
                    try:
                        tools = await Tools.connect({"faulty": url}, stack, timeout=3.0)
                        break
                    except Exception:
                        await asyncio.sleep(0.5)
                names = {t["function"]["name"] for t in tools.schemas}
                assert {"faulty_fine", "faulty_raises", "faulty_hangs", "faulty_blocks"} <= names
                return {
                    "fine": await tools.call("faulty_fine", {"text": "hi"}),
                    "raises": await tools.call("faulty_raises", {}),
                    "hangs": await tools.call("faulty_hangs", {}),
                    "floods": await tools.call("faulty_floods", {}),
                    "unknown": await tools.call("faulty_nope", {}),
                    "after": await tools.call("faulty_fine", {"text": "again"}),
                    "blocks": await tools.call("faulty_blocks", {}),
                    "after_block": await tools.call("faulty_fine", {"text": "stuck"}),
                }

        answers = asyncio.run(calls())
    finally:
        os.killpg(server.pid, 9)
        server.wait()
        port_file.unlink(missing_ok=True)
    assert answers["fine"] == "fine: hi" and answers["after"] == "fine: again"
    assert answers["raises"].startswith("error:") and "the tool broke" in answers["raises"]
    assert answers["hangs"].startswith("error:") and "took over 3 s" in answers["hangs"]
    assert answers["unknown"].startswith("error: unknown tool")
    # the flood arrives whole, and the harness shows the model its first RESULT_LIMIT characters
    assert len(answers["floods"]) > RESULT_LIMIT
    # a tool that blocks its server: that call and every later one are answered by the timeout
    for name in ("blocks", "after_block"):
        assert answers[name].startswith("error:") and "took over 3 s" in answers[name], name


def test_a_tool_call_in_a_broken_format_is_counted_by_how_it_is_broken(
    smollm2_dir: Path, verifiers_fixtures: Path
) -> None:
    from transformers import AutoTokenizer
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask

    from asyncrl.envs.verifiers.episodes import tool_calls

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    written = [
        '<tool_call>{"name": "calc_add", "arguments": {"a": 1, "b": 2}}</tool_call>',
        '<tool_call>{"name": "calc_add", "arguments": {"a": 1,</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "calc_mul", "arguments": {}}</tool_call>',
        'sure <tool_call>{"name": "calc_add"',
    ]
    nodes = [{"message": {"role": "user", "content": "add"}, "token_ids": [1], "mask": [False],
              "tools": [{"name": "calc_add", "parameters": {"type": "object"}}]}]  # fmt: skip
    for text in written:
        ids = [*tokenizer.encode(text, add_special_tokens=False), 2]
        nodes.append({"message": {"role": "assistant", "content": text}, "sampled": True,
                      "token_ids": ids, "mask": [True] * len(ids), "parent": len(nodes) - 1,
                      "logprobs": [-0.1] * len(ids)})  # fmt: skip
    trace = Trace.model_validate({
        "task": TraceTask(type="Task", data={"prompt": "add"}).model_dump(),
        "agent": AgentInfo(config={}).model_dump(), "nodes": nodes,
    })  # fmt: skip
    counted = tool_calls(trace, lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    assert counted == {
        "calc_add": 1, "none": 4, "none/invalid_json": 1, "none/missing_name": 1,
        "none/unknown_tool": 1, "none/unclosed_block": 1,
    }  # fmt: skip
    assert json.dumps(counted)  # plain data, as the record carries it
