"""Reward code that raises, returns NaN or hangs costs one rollout, never the run."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import asyncrl
from asyncrl.envs import load_environment
from asyncrl.envs.reward_pool import RewardPool, RewardResult
from asyncrl.user_code import pass_through

pytestmark = pytest.mark.integration

PACKAGE = textwrap.dedent(
    """
    import math, os, subprocess, sys, time
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
                RewardFunction("hostile", self.hostile, weight=2.0),
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

        def hostile(self, completion, example):
            # what careless reward code does: shells out, reads stdin, overflows, leaks
            if completion == "echo":
                subprocess.run(["echo", "hi"], check=True)  # writes to fd 1
                sys.stdout.write("and print" + chr(10))
            if completion == "read-stdin":
                subprocess.run(["head", "-c", "1"], check=True)  # would eat the next task
                return float(len(sys.stdin.read()))
            if completion == "huge":
                return 1e308  # finite, but twice that is not
            if completion == "grandchild":
                child = subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL)
                open(os.environ["GRANDCHILD_PID"], "w").write(str(child.pid))
                subprocess.run(["sleep", "20"])  # holds every inherited pipe
            if completion == "memory":
                return float(len(bytearray(3 * 2**30)))
            if completion == "spin":
                while True:
                    pass
            return 0.0

        def step_rewards(self, completion, example):
            if completion == "many-steps":
                return [(i, 0.5) for i in range(1_000_000)]  # an answer line of ~12 MB
            return []

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
            assert hung.lost == "timeout" and hung.reward == 0.0
            assert other.reward == pytest.approx(2.75)  # the other worker kept serving

            again = await pool.score("yes", example)  # the killed worker was replaced
            assert again.reward == pytest.approx(2.75)
            assert pool.failures == {"raises": 1, "nan": 1, "timeout": 1}
        finally:
            await pool.close()

    asyncio.run(scenario())


def alive(pid: int) -> bool:
    """Running or sleeping: a zombie waiting for its reaper counts as gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


Score = tuple[str, RewardResult, float]  # completion, result, seconds it took


def score_each(
    env_id: str, completions: list[str], steps: bool = False, **limits: Any
) -> list[Score]:
    """Score `completions` one after another on a one-worker pool with `limits`."""

    async def scenario() -> list[Score]:
        env = load_environment(env_id, {})
        example = env.examples("train", 1)[0]
        pool = RewardPool(env_id, {}, env.rubric, num_workers=1, **limits)
        await pool.start()
        results: list[Score] = []
        try:
            for completion in completions:
                started = time.monotonic()
                result = await pool.score(completion, example, steps=steps)
                results.append((completion, result, time.monotonic() - started))
        finally:
            await pool.close()
        assert sum(pool.failures.values()) == sum(
            len(r.failed) + (r.lost is not None) for _, r, _ in results
        )  # every failure counted once
        return results

    return asyncio.run(scenario())


def test_subprocess_output_and_stdin_never_reach_the_protocol(env_on_path: str) -> None:
    """fd 1 used to be the answer pipe: `echo` from a reward shifted every later answer by one
    rollout, and a child reading stdin ate the next task."""
    expected = {"echo": 0.75, "yes": 1.75, "read-stdin": 0.75, "boom": 0.5}
    script = ["echo", "yes", "read-stdin", "yes", "boom", "yes"]
    for completion, result, _ in score_each(env_on_path, script, timeout=5.0):
        assert result.reward == pytest.approx(expected[completion]), completion
        assert result.lost is None


def test_a_hung_grandchild_costs_the_timeout_and_leaves_no_process(
    env_on_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killing only the worker left `sleep 20` holding its pipes (a 2 s timeout took 20 s) and
    a detached `sleep 30` outliving `close()`; the whole process group goes now."""
    pid_file = tmp_path / "grandchild.pid"
    monkeypatch.setenv("GRANDCHILD_PID", str(pid_file))
    pass_through("GRANDCHILD_PID")  # as `reward_env_passthrough` would: not on the allowlist
    (_, hung, seconds), (_, after, _) = score_each(env_on_path, ["grandchild", "yes"], timeout=2.0)
    assert seconds < 2.0 + 2.5  # the timeout and the kill grace
    assert hung.lost == "timeout" and hung.reward == 0.0
    assert not alive(int(pid_file.read_text()))
    assert after.reward == pytest.approx(1.75)  # a new worker serves


def test_an_oversized_answer_marks_the_worker_dead(env_on_path: str) -> None:
    (_, big, _), (_, after, _) = score_each(
        env_on_path, ["many-steps", "yes"], steps=True, timeout=20.0
    )
    assert big.lost == "worker_protocol" and big.reward == 0.0
    assert after.reward == pytest.approx(1.75)


def test_an_overflowing_total_is_a_counted_failure_not_a_crash(env_on_path: str) -> None:
    """Each term was finite (1e308), the weighted sum inf: advantages became NaN, and two such
    rewards raised OverflowError in the group mean."""
    [(_, huge, _)] = score_each(env_on_path, ["huge"], timeout=5.0)
    assert huge.reward == 0.0 and huge.failed == ["out_of_range"]


def test_memory_and_cpu_limits_cost_one_rollout(env_on_path: str) -> None:
    (_, memory, _), (_, spin, seconds), (_, after, _) = score_each(
        env_on_path, ["memory", "spin", "yes"], timeout=30.0, memory_limit=1.0, cpu_limit=1.0
    )
    assert memory.failed == ["hostile"] and memory.reward == pytest.approx(0.75)  # 3 GiB > 1
    assert spin.lost == "worker_died" and seconds < 10.0  # SIGXCPU, long before the timeout
    assert after.reward == pytest.approx(1.75)


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
                assert result.reward == pytest.approx(2.75) and result.lost is None
        finally:
            await pool.close()

    asyncio.run(scenario())


ORPHANING_HOST = """
import asyncio, sys
from asyncrl.envs import load_environment
from asyncrl.envs.reward_pool import RewardPool

async def main():
    env = load_environment(sys.argv[1], {})
    example = env.examples("train", 1)[0]
    pool = RewardPool(sys.argv[1], {}, env.rubric, num_workers=2, timeout=600)
    await pool.start()
    busy = asyncio.ensure_future(pool.score("hang", example))  # stuck in a reward
    await asyncio.sleep(1)
    with open(sys.argv[2], "w") as out:
        out.write(" ".join(str(worker.process.pid) for worker in pool._workers))
    await busy

asyncio.run(main())
"""


def test_workers_die_with_the_process_that_runs_the_pool(env_on_path: str, tmp_path: Path) -> None:
    """A killed orchestrator (SIGKILL: it cannot clean up) leaves no worker behind, not even one
    stuck in a reward."""
    pids_file = tmp_path / "workers"
    source = str(Path(asyncrl.__file__).parents[1])  # this asyncrl, whatever PYTHONPATH says
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([os.environ["PYTHONPATH"], source])}
    host = subprocess.Popen(
        [sys.executable, "-c", ORPHANING_HOST, env_on_path, str(pids_file)], env=environment
    )
    deadline = time.monotonic() + 120
    while not pids_file.exists() or not pids_file.read_text():
        assert host.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    workers = [int(pid) for pid in pids_file.read_text().split()]
    assert len(workers) == 2 and all(alive(pid) for pid in workers)
    host.kill()
    host.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if alive(pid)]
    for pid in left:  # the old behaviour: clean up what the test proved was orphaned
        os.kill(pid, signal.SIGKILL)
    assert not left, f"reward workers {left} outlived the process that started them"
