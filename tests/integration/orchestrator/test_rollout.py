"""One group against the real server: chat prompts and pre-tokenized prompts alike."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs import load_environment
from asyncrl.envs.reward_pool import RewardPool
from asyncrl.launch.inference_process import inference_server
from asyncrl.orchestrator.buffer import Buffer
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.rollout import GroupAborted, GroupRequest, run_group

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("source", ["chat", "token_ids"])
def test_group_samples_are_aligned_and_scored(
    source: str, server_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    data = tmp_path / "d.jsonl"
    if source == "chat":
        rows = [{"input": f"abc{i}", "answer": f"{i}cba"} for i in range(40)]
    else:
        rows = [{"input_token_ids": [70, 71, 72 + i % 20], "answer": "x"} for i in range(40)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    env_spec = {"id": "jsonl", "args": {"path": str(data), "reward": "lcs"}}
    config = OrchestratorConfig(
        model={"name": str(tiny_model_dir)}, env=[env_spec], batch_size=4,
        rollouts_per_example=4, sampling={"max_tokens": 6, "temperature": 0.9},
        client={"base_url": [f"{server_url}/v1"]},
    )  # fmt: skip
    env = load_environment("jsonl", env_spec["args"])

    async def scenario() -> None:
        clients = ClientPool(config.client)
        await clients.start(str(tiny_model_dir))
        rewards = RewardPool("jsonl", env_spec["args"], env.rubric, num_workers=1)
        await rewards.start()
        buffer = Buffer([env], config.buffer, 0, pool_size=40)
        drawn = buffer.draw()
        request = GroupRequest(drawn, "jsonl", str(tiny_model_dir), 0.9, 3, launch_version=0)
        group = await run_group(request, config, clients, rewards, vocab_size=128)
        await rewards.close()
        await clients.close()

        assert len(group.samples) == 4
        for sample, reward in zip(group.samples, group.rewards, strict=True):
            n = len(sample.completion_ids)
            assert 1 <= n <= 6 and sample.problems() == []
            assert len(sample.inference_logprobs) == len(sample.policy_versions) == n
            assert all(lp <= 0 for lp in sample.inference_logprobs)
            assert sample.reward == reward and 0.0 <= reward <= 1.0
            if source == "token_ids":
                assert sample.prompt_ids == drawn.example.prompt_token_ids
            else:
                assert len(sample.prompt_ids) > len(drawn.example.prompt[0]["content"])
        mean = sum(group.rewards) / 4
        assert [s.advantages[0] for s in group.samples] == pytest.approx(
            [r - mean for r in group.rewards]
        )

    asyncio.run(scenario())


STEPPER = """
from asyncrl.envs.base import Example, RewardFunction


class Stepper:
    name = "stepper"

    def __init__(self):
        self.rubric = [RewardFunction("length", lambda c, e: min(1.0, len(c) / 10))]

    def examples(self, split, count):
        return [Example(i, [{"role": "user", "content": "go"}], "", "stepper")
                for i in range(count)]

    def step_rewards(self, completion, example):
        # a step ends after the 2nd character (reward: is it 'a') and at the end (length / 10)
        return [(2, float(completion[1:2] == "a")), (len(completion), len(completion) / 10)]


def load_environment():
    return Stepper()
"""


def test_process_supervision_turns_step_rewards_into_per_token_advantages(
    server_url: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    from asyncrl.orchestrator.advantage import process_advantages

    (tmp_path / "stepper_env.py").write_text(STEPPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    config = OrchestratorConfig(
        model={"name": str(tiny_model_dir)}, env=[{"id": "me/stepper-env"}], batch_size=4,
        rollouts_per_example=4, sampling={"max_tokens": 8, "temperature": 1.0},
        client={"base_url": [f"{server_url}/v1"]}, advantage={"type": "process"},
    )  # fmt: skip
    env = load_environment("me/stepper-env")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    async def scenario() -> None:
        clients = ClientPool(config.client)
        await clients.start(str(tiny_model_dir))
        rewards = RewardPool("me/stepper-env", {}, env.rubric, num_workers=1)
        await rewards.start()
        buffer = Buffer([env], config.buffer, 0, pool_size=4)
        request = GroupRequest(buffer.draw(), "stepper", str(tiny_model_dir), 1.0, 5, 0)

        def decode(ids: list[int]) -> str:
            return tokenizer.decode(ids, skip_special_tokens=True)

        group = await run_group(request, config, clients, rewards, 128, decode)
        await rewards.close()
        await clients.close()

        # by hand: a step ending at character c ends at the first token whose prefix decodes to
        # at least c characters (special tokens decode to nothing, as in the completion text)
        def token_of(ids: list[int], end: int) -> int:
            return next(t for t in range(len(ids)) if len(decode(ids[: t + 1])) >= end)

        steps = []
        for sample in group.samples:
            ids, text = sample.completion_ids, decode(sample.completion_ids)
            steps.append(
                [(token_of(ids, 2), float(text[1:2] == "a")),
                 (token_of(ids, len(text)), len(text) / 10)]
            )  # fmt: skip
        expected = process_advantages(steps, [len(s.completion_ids) for s in group.samples])
        for sample, want in zip(group.samples, expected, strict=True):
            assert sample.advantages == pytest.approx(want, abs=1e-6)
        assert any(len(set(s.advantages)) > 1 for s in group.samples)  # really per token

    asyncio.run(scenario())


async def generating(client: httpx.AsyncClient) -> bool:
    text = (await client.get("/metrics")).text
    running = next(
        line for line in text.splitlines() if line.startswith("asyncrl:num_requests_running")
    )
    return float(running.split()[-1]) > 0


@pytest.mark.parametrize("retries", [1, 0])
def test_a_group_the_server_aborts_is_generated_again_or_dropped(
    retries: int, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """An aborted completion (a pause with mode=abort) used to be trained as if it had
    finished; now the whole group is asked again, and after `abort_retries` it is dropped."""
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"input": f"abc{i}", "answer": "x"}) for i in range(8)))
    env_spec = {"id": "jsonl", "args": {"path": str(data), "reward": "lcs"}}
    env = load_environment("jsonl", env_spec["args"])
    with inference_server(tiny_model_dir, "--max_model_len", "512") as url:
        config = OrchestratorConfig(
            model={"name": str(tiny_model_dir)}, env=[env_spec], batch_size=2,
            rollouts_per_example=2, client={"base_url": [f"{url}/v1"]},
            sampling={"max_tokens": 400, "min_tokens": 400, "temperature": 1.0},
        )  # fmt: skip

        async def scenario() -> None:
            clients = ClientPool(config.client)
            await clients.start(str(tiny_model_dir))
            rewards = RewardPool("jsonl", env_spec["args"], env.rubric, num_workers=1)
            await rewards.start()
            drawn = Buffer([env], config.buffer, 0, pool_size=8).draw()
            request = GroupRequest(drawn, "jsonl", str(tiny_model_dir), 1.0, 3, launch_version=0)
            group = asyncio.create_task(
                run_group(request, config, clients, rewards, vocab_size=128, abort_retries=retries)
            )
            try:
                async with httpx.AsyncClient(base_url=url) as control:
                    while not await generating(control):  # the first attempt has begun
                        await asyncio.sleep(0.05)
                    (await control.post("/pause", params={"mode": "abort"})).raise_for_status()
                    (await control.post("/resume")).raise_for_status()
                if retries == 0:
                    with pytest.raises(GroupAborted):
                        await group
                    return
                done = await group
                assert done.aborted_retries == 1
                assert [len(s.completion_ids) for s in done.samples] == [400, 400]
            finally:
                await rewards.close()
                await clients.close()

        asyncio.run(scenario())
