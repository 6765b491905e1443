"""`asyncrl env-server` under load and abuse, as a real process: it answers /health while it
makes a large /examples answer, refuses what is over its limits at once (503, 422) instead of
queueing without bound, refuses to serve other machines without a key, answers a failed turn
without a traceback; a turn's slow tool calls end the turn's tools, not its worker."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from asyncrl.envs import load_environment
from asyncrl.envs.base import Example
from asyncrl.envs.remote import RemotePool, remote_environment
from asyncrl.envs.reward_pool import RewardPool
from asyncrl.launch.inference_process import free_port
from asyncrl.processes import wait_healthy

pytestmark = pytest.mark.integration

KEY = "env-secret-of-this-test"
HEADERS = {"Authorization": f"Bearer {KEY}"}
EXAMPLE = {"example_id": 0, "prompt": [], "answer": "y", "task": "slow"}

PACKAGE = textwrap.dedent(
    """
    import time
    from asyncrl.envs.base import Example, RewardFunction
    from asyncrl.envs.multi_turn import Reply
    from asyncrl.envs.tools import Tool, answer_tool_calls

    NAP = Tool("nap", "Sleeps 5 s.", {"type": "object", "properties": {}},
               lambda: time.sleep(5) or "rested", timeout=5)

    class SlowEnv:
        name = "slow"
        max_turns = 2

        def __init__(self):
            self.rubric = [RewardFunction("slow", self.slow_reward)]

        def slow_reward(self, completion, example):
            time.sleep(2)
            return 1.0

        def examples(self, split, count):
            if count == 7:  # a slow one to make
                time.sleep(3)
            return [Example(example_id=i, prompt=[{"role": "user", "content": "x"}],
                            answer="y", task="slow") for i in range(count)]

        def respond(self, messages, example):
            if messages[-1]["content"] == "boom":
                raise ValueError("the environment broke")
            answered = answer_tool_calls(messages[-1]["content"], [NAP])
            if answered is None:
                return Reply(done=True)
            return Reply(answered[0], tool_calls=answered[1])

    def load_environment():
        return SlowEnv()
    """
)


@pytest.fixture(scope="module")
def env_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("package")
    (folder / "slow_env.py").write_text(PACKAGE)
    return folder


def env_server(package: Path, *args: str, key: str | None = KEY) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "ASYNCRL_ENV_API_KEY"}
    env["PYTHONPATH"] = os.pathsep.join([str(package), env.get("PYTHONPATH", "")])
    if key is not None:
        env["ASYNCRL_ENV_API_KEY"] = key
    return subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "env-server", "--env.id", "someone/slow-env", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(env_package: Path) -> Iterator[str]:
    port = free_port()
    process = env_server(env_package, "--port", str(port), "--workers", "1", "--max_queued", "1")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, 120)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_health_answers_while_examples_are_made(server: str) -> None:
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(httpx.post, f"{server}/examples", json={"split": "train", "count": 7},
                           headers=HEADERS, timeout=60)  # fmt: skip
        time.sleep(1.0)  # the 3 s of making them have begun
        started = time.monotonic()
        assert httpx.get(f"{server}/health", timeout=10).status_code == 200
        assert time.monotonic() - started < 1.0
        assert len(slow.result().json()) == 7


def test_more_examples_than_the_limit_are_refused(server: str) -> None:
    response = httpx.post(f"{server}/examples", json={"split": "train", "count": 100_001},
                          headers=HEADERS, timeout=60)  # fmt: skip
    assert response.status_code == 422
    assert "max_examples_per_request" in response.text


def test_work_beyond_the_workers_and_queue_is_refused_at_once(server: str) -> None:
    """One worker and one queued: of four 2-s rewards sent together two are taken and two
    refused at once, not held (with their bodies) until a worker is free."""
    body = {"completion": "y", "example": EXAMPLE}

    def post() -> tuple[int, float]:
        started = time.monotonic()
        response = httpx.post(f"{server}/score", json=body, headers=HEADERS, timeout=60)
        return response.status_code, time.monotonic() - started

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: post(), range(4)))
    assert sorted(code for code, _ in answers) == [200, 200, 503, 503]
    assert all(seconds < 1.5 for code, seconds in answers if code == 503)


def test_a_failed_turn_is_answered_without_a_traceback(server: str) -> None:
    example = EXAMPLE
    empty = httpx.post(f"{server}/respond", json={"messages": [], "example": example},
                       headers=HEADERS, timeout=30)  # fmt: skip
    assert empty.status_code == 422 and "Traceback" not in empty.text
    broken = httpx.post(
        f"{server}/respond", headers=HEADERS, timeout=30,
        json={"messages": [{"role": "assistant", "content": "boom"}], "example": example},
    )  # fmt: skip
    assert broken.status_code == 200
    assert broken.json() == {
        "error": {"kind": "error", "message": "ValueError: the environment broke"}
    }


def test_serving_other_machines_without_a_key_is_refused(env_package: Path) -> None:
    # an address of no machine here (TEST-NET-3): it is refused before anything is bound
    process = env_server(env_package, "--host", "203.0.113.7", "--port", str(free_port()),
                         key=None)  # fmt: skip
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 2
    assert b"ASYNCRL_ENV_API_KEY is unset" in output


def test_slow_tool_calls_end_the_turns_tools_not_its_worker(env_package: Path, monkeypatch) -> None:
    """Four 5-s tool calls in one turn whose timeout is 8 s: the turn is answered in time (the
    calls share 80 % of it), and the worker is not killed for it."""
    monkeypatch.syspath_prepend(str(env_package))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(env_package), os.environ.get("PYTHONPATH", "")])
    )
    env = load_environment("someone/slow-env", {})
    example = env.examples("train", 1)[0]
    naps = " ".join('<tool_call>{"name": "nap", "arguments": {}}</tool_call>' for _ in range(4))
    turn = [{"role": "assistant", "content": naps}]

    async def scenario() -> None:
        pool = RewardPool("someone/slow-env", {}, env.rubric, num_workers=1, timeout=8.0)
        await pool.start()
        try:  # a first turn without calls: the worker has loaded the environment
            assert (await pool.respond([{"role": "assistant", "content": "hi"}], example)).done
            started = time.monotonic()
            reply = await pool.respond(turn, example)
            assert time.monotonic() - started < 8.0
            # the first cut by its own 5 s, the second by what was left of 6.4 s, then none
            assert [record.error for record in reply.tool_calls] == [
                "timeout", "timeout", "out_of_time", "out_of_time"
            ]  # fmt: skip
            assert not pool.failures  # no worker timed out or was replaced
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_the_orchestrators_side_sends_no_more_than_the_server_admits(server: str) -> None:
    """Five 2-s rewards at once against one worker and one place in the queue: the remote pool
    holds the rest back itself, so none is refused and every rollout is scored."""
    remote = remote_environment(server, KEY)
    assert remote.capacity == 2
    example = Example(**EXAMPLE)

    async def scenario() -> list[float]:
        pool = RemotePool(remote, timeout=30)
        await pool.start()
        try:
            results = await asyncio.gather(*(pool.score("y", example) for _ in range(5)))
        finally:
            await pool.close()
        assert not pool.failures
        return [result.reward for result in results]

    assert asyncio.run(scenario()) == [1.0] * 5
