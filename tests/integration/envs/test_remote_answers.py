"""The orchestrator's side of an env-server (`RemotePool`) against a server that answers badly:
a refusal (401 after a key change, 404, 422), an answer that is not the protocol's or past its
size, and rewards a local pool would refuse (NaN, 1e308, an infinite step) each cost one
rollout (reward 0, counted), never the run. The server here is a real HTTP server on 127.0.0.1
whose answers the test chooses (`scripted_env_server`)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.envs import remote
from asyncrl.envs.base import Example
from asyncrl.envs.remote import RemotePool, remote_environment
from asyncrl.envs.reward_pool import EnvironmentFailed

pytestmark = pytest.mark.integration

INFO = {"name": "scripted", "rubric": [{"name": "right", "weight": 1.0}], "multi_turn": True,
        "max_turns": 2}  # fmt: skip
EXAMPLE = Example(example_id=0, prompt=[{"role": "user", "content": "x"}], answer="y", task="t")


class Scripted:
    """What the server answers next on /score and /respond: (status, raw body)."""

    def __init__(self) -> None:
        self.answer: tuple[int, bytes] = (200, b"{}")


@pytest.fixture
def scripted_env_server() -> Iterator[tuple[str, Scripted]]:
    script = Scripted()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # /info
            self._reply(200, json.dumps(INFO).encode())

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self._reply(*script.answer)

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()


def score_with(url: str, script: Scripted, status: int, body: bytes) -> tuple[Any, RemotePool]:
    script.answer = (status, body)
    pool = RemotePool(remote_environment(url, "key"), timeout=5)

    async def scenario() -> Any:
        await pool.start()
        try:
            return await pool.score("y", EXAMPLE)
        finally:
            await pool.close()

    return asyncio.run(scenario()), pool


@pytest.mark.parametrize("status", [401, 404, 408, 422])
def test_a_refusal_costs_the_rollout_not_the_run(scripted_env_server, status: int) -> None:
    url, script = scripted_env_server
    body = json.dumps({"error": {"message": "missing or wrong API key"}}).encode()
    result, pool = score_with(url, script, status, body)
    assert result.reward == 0.0 and result.lost == "remote_rejected"
    assert pool.failures == {"remote_rejected": 1}


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1, 2]", b"{}", b'{"reward": "high", "values": {}}',
     b'{"reward": 1.0, "values": {"right": true}}', b'{"reward": 1.0, "values": [1]}'],
)  # fmt: skip
def test_an_answer_outside_the_protocol_costs_the_rollout(scripted_env_server, body) -> None:
    url, script = scripted_env_server
    result, pool = score_with(url, script, 200, body)
    assert result.reward == 0.0 and result.lost == "remote_malformed"
    assert pool.failures == {"remote_malformed": 1}


@pytest.mark.parametrize(
    "answer",
    [{"reward": float("nan"), "values": {"right": 1.0}},
     {"reward": 1e308, "values": {"right": 1.0}},
     {"reward": 1.0, "values": {"right": float("inf")}},
     {"reward": 1.0, "values": {"right": 1.0}, "steps": [[99999, float("inf")]]}],
)  # fmt: skip
def test_a_remote_reward_is_held_to_the_local_bounds(scripted_env_server, answer) -> None:
    url, script = scripted_env_server
    result, pool = score_with(url, script, 200, json.dumps(answer).encode())
    assert result.reward == 0.0 and "out_of_range" in result.failed
    assert all(abs(value) <= 1e9 for value in result.values.values())
    assert pool.failures == {"out_of_range": 1}


def test_a_good_answer_still_scores(scripted_env_server) -> None:
    url, script = scripted_env_server
    answer = {"reward": 0.5, "values": {"right": 0.5}, "steps": [[3, 0.25]]}
    result, pool = score_with(url, script, 200, json.dumps(answer).encode())
    assert (result.reward, result.values, result.steps) == (0.5, {"right": 0.5}, [(3, 0.25)])
    assert not pool.failures


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [(401, b"{}", "remote_rejected"), (200, b'{"messages": "hi"}', "remote_malformed"),
     (200, b'{"messages": [{"role": "assistant", "content": "x"}], "done": false, '
           b'"tool_calls": []}', "remote_malformed")],
)  # fmt: skip
def test_a_bad_answer_to_a_turn_ends_the_episode_only(scripted_env_server, status, body, kind):
    url, script = scripted_env_server
    script.answer = (status, body)
    pool = RemotePool(remote_environment(url, "key"), timeout=5)

    async def scenario() -> None:
        await pool.start()
        try:
            with pytest.raises(EnvironmentFailed) as failed:
                await pool.respond([{"role": "assistant", "content": "y"}], EXAMPLE)
            assert failed.value.kind == kind
        finally:
            await pool.close()

    asyncio.run(scenario())
    assert pool.failures == {kind: 1}


def test_an_answer_past_its_size_costs_the_rollout_naming_the_server(
    scripted_env_server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Answers used to be read whole, however large (issue 86): a server could fill the
    orchestrator's memory with one reward."""
    monkeypatch.setattr(remote, "ANSWER_LIMIT", 4096)
    url, script = scripted_env_server
    padded = {"reward": 1.0, "values": {"right": 1.0}, "padding": "x" * 10_000}
    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        result, pool = score_with(url, script, 200, json.dumps(padded).encode())
    assert result.reward == 0.0 and result.lost == "remote_too_large"
    assert pool.failures == {"remote_too_large": 1}
    assert f"env-server {url}/score: answered more than 4096 bytes" in caplog.text


def test_examples_past_their_size_stop_the_start_naming_the_server(
    scripted_env_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "EXAMPLES_LIMIT", 4096)
    url, script = scripted_env_server
    example = {"example_id": 0, "prompt": [{"role": "user", "content": "x" * 100}],
               "answer": "y", "task": "t"}  # fmt: skip
    script.answer = (200, json.dumps([example] * 100).encode())
    with pytest.raises(ConfigError, match=rf"env-server {url}/examples answered more than 4096"):
        remote_environment(url, "key").examples("train", 100)
    script.answer = (200, json.dumps([example] * 10).encode())  # within it: read
    assert len(remote_environment(url, "key").examples("train", 10)) == 10
