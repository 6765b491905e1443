"""A judge that hangs, errors, answers garbage or goes down costs rollouts, never the run: each
such rollout scores 0, its rule-based terms are still scored, and the failure is counted by kind
in the step's metrics. Real `asyncrl infer` servers, stopped, killed or misused for real."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from examples.judges.judge_data import JUDGE_PROMPT

from asyncrl.config.base import ConfigError
from asyncrl.config.model_rewards import JudgeTermConfig
from asyncrl.envs import load_environment
from asyncrl.envs.base import Example
from asyncrl.envs.model_rewards.judge import JudgeTerm
from asyncrl.envs.model_rewards.pool import ModelRewardPool, model_reward_metrics
from asyncrl.envs.reward_pool import RewardPool, RewardResult
from asyncrl.launch.inference_process import free_port
from asyncrl.processes import start, stop, wait_healthy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = Example(0, [{"role": "user", "content": "abc de"}], "ed cba", "reverse-text")
COMPLETIONS = ["ed cba", "xyz"]


@pytest.fixture
def judge_process(tiny_judge_dir: Path, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """A judge server of this test's own, to stop and kill."""
    port = free_port()
    command = [sys.executable, "-m", "asyncrl.cli", "infer", "--model", str(tiny_judge_dir),
               "--port", str(port), "--max_model_len", "256"]  # fmt: skip
    process = start(command, tmp_path / "judge.log")  # its own process group, for `stop`
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, timeout=600)
        yield url, process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
        stop(process)


def judge_config(url: str, **settings: object) -> JudgeTermConfig:
    fields: dict[str, object] = dict(
        base_url=f"{url}/v1", prompt=JUDGE_PROMPT, scale=(0, 9), timeout=2.0, retries=1,
        backoff=0.1,
    )  # fmt: skip
    return JudgeTermConfig(**{**fields, **settings})


class Scoring:
    """The reverse-text rubric in its workers with a judge term beside it, as the orchestrator
    scores a group, and the metrics it would log for the step."""

    def __init__(self, config: JudgeTermConfig) -> None:
        rubric = load_environment("reverse-text").rubric
        self.pool = ModelRewardPool(RewardPool("reverse-text", {}, rubric, num_workers=1),
                                    [JudgeTerm(config)])  # fmt: skip

    async def group(self, completions: list[str] = COMPLETIONS) -> list[RewardResult]:
        return list(await asyncio.gather(*(self.pool.score(c, EXAMPLE) for c in completions)))

    def metrics(self) -> dict[str, float]:
        return model_reward_metrics([self.pool])


def assert_cost_the_rollouts(results: list[RewardResult]) -> None:
    for result in results:
        assert result.reward == 0.0
        assert result.failed == ["judge"]
        assert result.values["judge"] == 0.0
    assert results[0].values["lcs_ratio"] == 1.0  # the rule-based term was still scored


def test_a_judge_that_hangs_times_out_with_retries_then_recovers(
    judge_process: tuple[str, subprocess.Popen],
) -> None:
    url, process = judge_process
    scoring = Scoring(judge_config(url))

    async def run() -> tuple[list[RewardResult], dict[str, float], float, list[RewardResult]]:
        await scoring.pool.start()
        try:
            os.kill(process.pid, signal.SIGSTOP)  # alive, listening, answering nothing
            started = time.monotonic()
            hung = await scoring.group()
            elapsed = time.monotonic() - started
            os.kill(process.pid, signal.SIGCONT)
            metrics = scoring.metrics()
            return hung, metrics, elapsed, await scoring.group()
        finally:
            await scoring.pool.close()

    hung, metrics, elapsed, recovered = asyncio.run(run())
    assert_cost_the_rollouts(hung)
    assert metrics["orchestrator/model_reward/judge/failed/timeout"] == 2
    assert metrics["orchestrator/model_reward/judge/retries"] == 2  # one retry per rollout
    assert metrics["orchestrator/model_reward/judge/requests"] == 4
    assert 2 * 2.0 + 0.1 <= elapsed < 30  # two attempts of 2 s and the backoff between them
    assert all(r.failed == [] and r.reward > r.values["lcs_ratio"] - 1e-9 for r in recovered)


def test_a_judge_that_goes_down_costs_rollouts_as_unavailable(
    judge_process: tuple[str, subprocess.Popen],
) -> None:
    url, process = judge_process
    scoring = Scoring(judge_config(url, retries=2))

    async def run() -> tuple[list[RewardResult], list[RewardResult], dict[str, float]]:
        await scoring.pool.start()
        try:
            before = await scoring.group()
            stop(process)  # mid-run: the server is gone, connections are refused
            return before, await scoring.group(), scoring.metrics()
        finally:
            await scoring.pool.close()

    before, after, metrics = asyncio.run(run())
    assert all(r.failed == [] for r in before)
    assert_cost_the_rollouts(after)
    prefix = "orchestrator/model_reward/judge"
    assert metrics[f"{prefix}/scored"] == 2 and metrics[f"{prefix}/failed/unavailable"] == 2
    assert metrics[f"{prefix}/retries"] == 4  # two retries each, with backoff


def test_a_judge_that_refuses_the_request_is_an_error_not_retried(
    judge_process: tuple[str, subprocess.Popen],
) -> None:
    url, _ = judge_process
    scoring = Scoring(judge_config(url))
    too_long = "z" * 400  # beyond the judge's max_model_len: a 400

    async def run() -> tuple[list[RewardResult], dict[str, float]]:
        await scoring.pool.start()
        try:
            return await scoring.group(["ed cba", too_long]), scoring.metrics()
        finally:
            await scoring.pool.close()

    (fine, refused), metrics = asyncio.run(run())
    assert fine.failed == [] and fine.reward > 0
    assert (refused.reward, refused.failed) == (0.0, ["judge"])
    prefix = "orchestrator/model_reward/judge"
    assert metrics[f"{prefix}/failed/error"] == 1
    assert (metrics[f"{prefix}/requests"], metrics[f"{prefix}/retries"]) == (2, 0)


def test_a_judge_that_answers_garbage_costs_rollouts_as_unparseable(server_url: str) -> None:
    # an untrained model: it answers newlines, no number and no verdict among its top tokens
    for read in ("number", "verdict"):
        scoring = Scoring(judge_config(server_url, read=read, verdicts={"Yes": 1.0, "No": 0.0}))

        async def run(scoring: Scoring = scoring) -> tuple[list[RewardResult], dict[str, float]]:
            await scoring.pool.start()
            try:
                return await scoring.group(), scoring.metrics()
            finally:
                await scoring.pool.close()

        results, metrics = asyncio.run(run())
        assert_cost_the_rollouts(results)
        assert metrics["orchestrator/model_reward/judge/failed/unparseable"] == 2
        assert metrics["orchestrator/model_reward/judge/retries"] == 0


def test_a_judge_s_key_comes_from_its_variable_and_a_missing_one_stops_start_up(
    tiny_judge_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    command = [
        sys.executable, "-m", "asyncrl.cli", "infer", "--model", str(tiny_judge_dir),
        "--port", str(port), "--max_model_len", "256", "--api_key_var", "JUDGE_TEST_KEY",
    ]  # fmt: skip
    process = start(command, tmp_path / "judge.log", {"JUDGE_TEST_KEY": "a-secret-of-the-judge"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, timeout=600)
        config = judge_config(url, api_key_var="JUDGE_TEST_KEY")
        monkeypatch.delenv("JUDGE_TEST_KEY", raising=False)
        with pytest.raises(ConfigError, match=r"answered 401 .*\$JUDGE_TEST_KEY is unset"):
            asyncio.run(JudgeTerm(config).start())
        monkeypatch.setenv("JUDGE_TEST_KEY", "a-secret-of-the-judge")
        scoring = Scoring(config)

        async def run() -> list[RewardResult]:
            await scoring.pool.start()
            try:
                return await scoring.group()
            finally:
                await scoring.pool.close()

        assert all(result.failed == [] for result in asyncio.run(run()))
    finally:
        stop(process)
