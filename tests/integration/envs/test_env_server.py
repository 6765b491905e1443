"""`asyncrl env-server` as a real process: the orchestrator's remote side gets the examples,
rewards and turns the local environment gives, behind an API key; a server that does not
answer costs the rollout, after retries, not the run."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from asyncrl.config.env import EnvConfig
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs import load_environment, score
from asyncrl.envs.episode_tokens import EpisodeTokens
from asyncrl.envs.multi_turn import Reply, is_multi_turn
from asyncrl.envs.remote import RemoteEnvironment, RemotePool, environment_of
from asyncrl.envs.reward_pool import EnvironmentFailed
from asyncrl.launch.inference_process import free_port
from asyncrl.orchestrator.buffer import Buffer
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.episode import EpisodeSetting, run_episode_group
from asyncrl.orchestrator.rollout import GroupRequest
from asyncrl.processes import wait_healthy

pytestmark = pytest.mark.integration

KEY = "env-secret"


@pytest.fixture(scope="module")
def env_server() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "env-server", "--env.id", "guess-number",
         "--env.args", "{max_turns: 3}", "--port", str(port), "--workers", "1"],
        env={**os.environ, "ASYNCRL_ENV_API_KEY": KEY},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, 120)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_the_remote_environment_is_the_local_one(env_server: str, monkeypatch) -> None:
    monkeypatch.setenv("ASYNCRL_ENV_API_KEY", KEY)
    remote = environment_of(EnvConfig(id="ignored", address=env_server))
    local = load_environment("guess-number", {"max_turns": 3})
    assert isinstance(remote, RemoteEnvironment) and is_multi_turn(remote)
    assert remote.name == local.name and remote.max_turns == 3
    assert [(t.name, t.weight) for t in remote.rubric] == [(t.name, t.weight) for t in local.rubric]
    served = remote.examples("eval", 5)  # named by the server and place, for error messages
    assert [e.source for e in served] == [f"env-server {env_server} example {i}" for i in range(5)]
    assert [replace(e, source=None) for e in served] == local.examples("eval", 5)
    example = local.examples("train", 1)[0]
    wrong = str(int(example.answer) + 1) if example.answer != str(example.info["high"]) else "1"
    episode = [*example.prompt, {"role": "assistant", "content": wrong}]

    async def scenario() -> None:
        pool = RemotePool(remote, timeout=10)
        await pool.start()
        try:
            assert await pool.respond(episode, example) == local.respond(episode, example)
            won = [*episode, {"role": "user", "content": "x"},
                   {"role": "assistant", "content": example.answer}]  # fmt: skip
            assert await pool.respond(won, example) == Reply(done=True)
            result = await pool.score(won, example)
            assert result.reward == pytest.approx(score(local, won, example)) and result.reward > 0
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_the_server_wants_its_key(env_server: str) -> None:
    assert httpx.get(f"{env_server}/health").status_code == 200
    assert httpx.get(f"{env_server}/info").status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    body = {"split": "train", "count": 1}
    assert httpx.post(f"{env_server}/examples", json=body, headers=wrong).status_code == 401


def test_episodes_play_against_the_remote_environment(
    env_server: str, server_url: str, tiny_model_dir: Path, monkeypatch
) -> None:
    monkeypatch.setenv("ASYNCRL_ENV_API_KEY", KEY)
    remote = environment_of(EnvConfig(id="guess-number", address=env_server))
    config = OrchestratorConfig(
        model={"name": str(tiny_model_dir)}, env=[{"id": "guess-number", "address": env_server}],
        batch_size=4, rollouts_per_example=4, seq_len=200,
        sampling={"max_tokens": 4, "temperature": 1.0}, client={"base_url": [f"{server_url}/v1"]},
    )  # fmt: skip
    tokens = EpisodeTokens(AutoTokenizer.from_pretrained(tiny_model_dir))

    async def scenario() -> None:
        clients = ClientPool(config.client)
        await clients.start(str(tiny_model_dir))
        pool = RemotePool(remote, timeout=10)
        await pool.start()
        try:
            drawn = Buffer([remote], config.buffer, 0, 8).draw()
            request = GroupRequest(drawn, "guess-number", str(tiny_model_dir), 1.0, 1, 0)
            setting = EpisodeSetting(config, clients, pool, tokens, remote.max_turns)
            group = await run_episode_group(request, setting, vocab_size=128)
        finally:
            await pool.close()
            await clients.close()
        assert len(group.samples) == 4 and all(s.problems() == [] for s in group.samples)
        assert 1 <= max(group.turns) <= 3 and not pool.failures
        assert all(
            end in ("done", "max_turns", "truncated", "budget") for end in group.episode_ends
        )

    asyncio.run(scenario())


def test_a_server_that_does_not_answer_costs_the_rollout_after_retries(env_server: str) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    info = httpx.get(f"{env_server}/info", headers=headers).json()
    gone = RemoteEnvironment(f"http://127.0.0.1:{free_port()}", headers, info)
    example = load_environment("guess-number").examples("train", 1)[0]

    async def scenario() -> None:
        pool = RemotePool(gone, timeout=1)
        await pool.start()
        try:
            result = await pool.score([*example.prompt], example)
            assert result.reward == 0.0 and result.lost == "remote_unavailable"
            with pytest.raises(EnvironmentFailed) as failed:
                await pool.respond([*example.prompt], example)
            assert failed.value.kind == "remote_unavailable"
        finally:
            await pool.close()
        assert pool.failures["remote_unavailable"] == 2

    asyncio.run(scenario())
