"""Reward code that raises, returns NaN or hangs costs one rollout, never the run."""

from __future__ import annotations

import asyncio
import textwrap
import time
from pathlib import Path

import pytest

from asyncrl.envs import load_environment
from asyncrl.envs.reward_pool import RewardPool

pytestmark = pytest.mark.integration

PACKAGE = textwrap.dedent(
    """
    import math, time
    from asyncrl.envs.base import Example, RewardFunction

    class FlakyEnv:
        name = "flaky"

        def __init__(self, bonus=1.0):
            print("user code may print; it must not break the protocol")
            self.rubric = [
                RewardFunction("exact", lambda c, e: float(c == e.answer), weight=bonus),
                RewardFunction("raises", self.raises, weight=1.0),
                RewardFunction("nan", lambda c, e: math.nan if c == "nan" else 0.5, weight=1.0),
                RewardFunction("hangs", self.hangs, weight=1.0),
            ]

        def raises(self, completion, example):
            if completion == "boom":
                raise RuntimeError("reward exploded")
            return 0.25

        def hangs(self, completion, example):
            if completion == "hang":
                time.sleep(1000)
            if completion == "slow":
                time.sleep(0.5)
            return 0.0

        def examples(self, split, count):
            return [Example(example_id=i, prompt=[{"role": "user", "content": "x"}],
                            answer="yes", task="flaky") for i in range(count)]

    def load_environment(bonus=1.0):
        return FlakyEnv(bonus)
    """
)


@pytest.fixture
def env_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "flaky_env.py").write_text(PACKAGE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the workers import it too
    return "someone/flaky-env"


def test_verifiers_style_package_loads_by_its_id(env_on_path: str) -> None:
    env = load_environment(env_on_path, {"bonus": 2.0})
    assert env.name == "flaky" and env.rubric[0].weight == 2.0


def test_raising_nan_and_hanging_rewards_each_cost_one_rollout(env_on_path: str) -> None:
    async def scenario() -> None:
        env = load_environment(env_on_path, {"bonus": 2.0})
        example = env.examples("train", 1)[0]
        pool = RewardPool(env_on_path, {"bonus": 2.0}, env.rubric, num_workers=2, timeout=2.0)
        await pool.start()
        try:
            good = await pool.score("yes", example)  # 2·1 + 0.25 + 0.5 + 0
            assert good.reward == pytest.approx(2.75) and not good.failed

            boom = await pool.score("boom", example)  # raises -> 0 for that term only
            assert boom.values["raises"] == 0.0 and boom.failed == ["raises"]
            assert boom.reward == pytest.approx(0.5)

            nan = await pool.score("nan", example)
            assert nan.failed == ["nan"] and nan.reward == pytest.approx(0.25)

            started = time.monotonic()
            hung, other = await asyncio.gather(
                pool.score("hang", example), pool.score("yes", example)
            )
            assert time.monotonic() - started < 2.0 + 3.0  # timeout plus a margin
            assert hung.timed_out and hung.reward == 0.0
            assert other.reward == pytest.approx(2.75)  # the other worker kept serving

            again = await pool.score("yes", example)  # the killed worker was replaced
            assert again.reward == pytest.approx(2.75)
            assert pool.failures == {"raises": 1, "nan": 1, "timeout": 1}
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_a_cancelled_scoring_never_hands_its_answer_to_the_next_rollout(env_on_path: str) -> None:
    """A rollout cancelled mid-scoring (the orchestrator shutting down a group) must not leave
    its answer in the worker's pipe, where the next rollout would read it as its own."""

    async def scenario() -> None:
        env = load_environment(env_on_path, {"bonus": 2.0})
        example = env.examples("train", 1)[0]
        pool = RewardPool(env_on_path, {"bonus": 2.0}, env.rubric, num_workers=1, timeout=5.0)
        await pool.start()
        try:
            slow = asyncio.create_task(pool.score("slow", example))  # scores 0.75 in 0.5 s
            await asyncio.sleep(0.2)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            await asyncio.sleep(0.5)  # the cancelled answer would be in the pipe by now
            for _ in range(2):
                result = await pool.score("yes", example)
                assert result.reward == pytest.approx(2.75) and not result.timed_out
        finally:
            await pool.close()

    asyncio.run(scenario())
