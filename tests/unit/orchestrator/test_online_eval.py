"""The eval summary by hand, which steps a run evaluates after a resume, and how many eval
requests go at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from asyncrl.config.orchestrator import EvalConfig, OrchestratorConfig
from asyncrl.envs.base import Example
from asyncrl.monitor.eval_records import summarize
from asyncrl.monitor.metrics import MetricsWriter
from asyncrl.orchestrator import online_eval
from asyncrl.orchestrator.buffer import Drawn
from asyncrl.orchestrator.episode import EpisodeSetting
from asyncrl.orchestrator.group import GroupRequest, request_body
from asyncrl.orchestrator.online_eval import EvalTarget, OnlineEval


def summary(results: list[list[tuple[float, list[int]]]], threshold: float = 1.0) -> dict:
    return summarize("sums", results, threshold, launch_version=4)


def test_mean_best_and_pass_at_k_by_hand() -> None:
    results = [
        [(1.0, [4, 4]), (0.0, [4, 5])],  # solved by one of two
        [(0.5, [5]), (0.25, [5, 5])],  # best 0.5: not solved
        [(0.0, []), (0.0, [])],  # empty completions: no tokens, no versions
    ]
    got = summary(results)
    assert got["eval/sums/mean@2"] == pytest.approx((1.0 + 0.0 + 0.5 + 0.25) / 6)
    assert got["eval/sums/best@2"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert got["eval/sums/pass@2"] == pytest.approx(1 / 3)
    assert (got["eval/sums/version"], got["eval/sums/version_max"]) == (4, 5)  # it moved on
    assert summary(results, threshold=0.5)["eval/sums/pass@2"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("resumed_at", "base", "skip", "expected"),
    [(0, True, True, 0), (0, False, True, 10), (10, True, True, 20), (10, True, False, 10),
     (13, True, True, 20)],
)  # fmt: skip
def test_first_step_after_a_start_or_a_resume(
    resumed_at: int, base: bool, skip: bool, expected: int
) -> None:
    config = EvalConfig(interval=10, eval_base_model=base, skip_eval_on_resume=skip)
    assert OnlineEval.first_step(config, resumed_at) == expected


def test_eval_asks_with_its_own_sampling_not_the_training_settings_it_does_not_name() -> None:
    """Eval plays groups through the training path (`episode.py`) with a setting of its own:
    its temperature, top_p, max_tokens and k; training's top_k, min_tokens, repetition
    penalty, filters, per-step advantages and skip_verification stay out."""
    training = OrchestratorConfig(
        model={"name": "m"}, env=[{"id": "reverse-text"}], rollouts_per_example=8,
        sampling={"temperature": 1.0, "top_k": 5, "min_tokens": 3, "repetition_penalty": 1.3,
                  "max_tokens": 40},
        filters=[{"type": "gibberish"}], advantage={"type": "process"},
        buffer={"skip_verification": True},
    )  # fmt: skip
    evaluation = EvalConfig(rollouts_per_example=2, sampling={"temperature": 0.0, "seed": 7})
    setting = EpisodeSetting(training, None, None, None)  # type: ignore[arg-type]
    played = OnlineEval.episode_setting(evaluation, training, setting)
    example = Example(3, [{"role": "user", "content": "abc"}], "cba", "reverse")
    request = GroupRequest(Drawn(0, example), "reverse", "m", 0.0, 10, launch_version=0)
    route, body = request_body(request, played.config)
    assert route == "chat/completions"
    assert (body["n"], body["temperature"], body["max_tokens"], body["seed"]) == (2, 0.0, 40, 10)
    assert (body["top_k"], body["min_tokens"], body["repetition_penalty"]) == (-1, 0, 1.0)
    assert played.config.filters == [] and played.config.advantage.type == "default"
    assert not played.config.buffer.skip_verification


def test_a_failed_step_0_evaluation_is_logged_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A scoring that raises (a dead eval target, a reward that fails) must not stop training:
    step 0's evaluation is awaited, so its error would otherwise end the run."""
    evaluator = OnlineEval(
        EvalConfig(interval=10), [], None, None, lambda: "m", 0, None,  # type: ignore[arg-type]
    )  # fmt: skip

    async def fails(step: int) -> None:
        raise RuntimeError(f"eval target unreachable at step {step}")

    monkeypatch.setattr(evaluator, "evaluate", fails)
    with caplog.at_level("ERROR"):
        asyncio.run(evaluator.evaluate_start())
    assert evaluator.next_step == 10
    assert "online eval failed: eval target unreachable at step 0" in caplog.text


class _Servers:
    """A stand-in for the client pool: only the weights version the evaluator reads."""

    def oldest_version(self) -> int:
        return 0


def test_the_cap_holds_beside_rollouts_and_lifts_when_the_eval_runs_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most `max_concurrent` eval requests beside training; step 0's evaluation and the
    ones the run's end waits for have nothing beside them and send every request at once.
    The server is a stand-in that counts the requests it holds at once."""
    holding, widest = 0, []

    async def served(request: GroupRequest, setting: object, vocab_size: int) -> SimpleNamespace:
        nonlocal holding
        holding += 1
        widest.append(holding)
        await asyncio.sleep(0.01)
        holding -= 1
        sample = SimpleNamespace(policy_versions=[0], completion_mask=[True])
        return SimpleNamespace(rewards=[1.0], samples=[sample])

    monkeypatch.setattr(online_eval, "run_episode_group", served)
    examples = [Example(i, [{"role": "user", "content": "x"}], "y", "t") for i in range(6)]
    target = EvalTarget("t", examples, None, None)  # type: ignore[arg-type]
    metrics = MetricsWriter(tmp_path / "metrics.jsonl", role="eval")

    def widest_of(run) -> int:  # type: ignore[no-untyped-def]
        widest.clear()
        evaluator = OnlineEval(
            EvalConfig(interval=1, max_concurrent=2), [target], _Servers(), metrics,  # type: ignore[arg-type]
            lambda: "m", 0, None,
        )  # fmt: skip
        asyncio.run(run(evaluator))
        return max(widest)

    async def beside_training(evaluator: OnlineEval) -> None:
        await evaluator.evaluate(1)

    async def at_the_end(evaluator: OnlineEval) -> None:
        evaluator.next_step = 0  # due: the servers are at version 0
        await evaluator.finish()

    assert widest_of(beside_training) == 2
    assert widest_of(OnlineEval.evaluate_start) == 6
    assert widest_of(at_the_end) == 6
    assert len(metrics.path.read_text().splitlines()) == 3  # each evaluation left its record
