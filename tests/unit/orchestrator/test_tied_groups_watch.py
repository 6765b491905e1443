"""The collapse warning and the sampler's entropy: a run whose groups all tie below the best
reward for `window` batches says so once; a solved task (all tied at the best) does not; the
sampled entropy is the mean −log p of the trained tokens of every rollout, tied ones included."""

from __future__ import annotations

import math

import pytest

from asyncrl.orchestrator.group import Group
from asyncrl.orchestrator.step_metrics import sampled_entropy
from asyncrl.orchestrator.tied_groups_watch import TiedGroupsWatch
from asyncrl.types import TrainingSample


def group(rewards: list[float], logprobs: list[float] | None = None) -> Group:
    mean = sum(rewards) / len(rewards)
    logprobs = logprobs or [-0.5, -0.25]
    samples = [
        TrainingSample(prompt_ids=[1], completion_ids=[2] * len(logprobs),
                       completion_mask=[True] * len(logprobs), inference_logprobs=logprobs,
                       advantages=[r - mean] * len(logprobs), policy_versions=[0] * len(logprobs),
                       temperature=1.0, env="e")
        for r in rewards
    ]  # fmt: skip
    return Group(drawn=None, env_name="e", samples=samples, rewards=rewards,  # type: ignore[arg-type]
                 values=[], truncated=[False] * len(rewards))  # fmt: skip


def test_a_streak_of_batches_tied_below_the_best_reward_is_said_once() -> None:
    watch = TiedGroupsWatch(window=3)
    assert watch.observe([group([0.0, 1.0]), group([1.0, 1.0])], 0.4) is None  # best is 1
    said = [watch.observe([group([0.0, 0.0]), group([1.0, 1.0])], 0.01) for _ in range(5)]
    assert said[:2] == [None, None]
    assert said[2] is not None and "3 batches" in said[2] and "0.010" in said[2]
    assert said[3:] == [None, None]  # once
    assert watch.streak == 5


def test_a_batch_with_signal_restarts_the_streak() -> None:
    watch = TiedGroupsWatch(window=2)
    watch.observe([group([0.0, 1.0])], None)
    watch.observe([group([0.0, 0.0])], None)
    watch.observe([group([0.0, 1.0])], None)  # signal again
    assert watch.streak == 0
    assert watch.observe([group([0.0, 0.0])], None) is None
    assert watch.observe([group([0.0, 0.0])], None) is not None


def test_a_solved_task_tied_at_the_best_reward_is_not_a_collapse() -> None:
    watch = TiedGroupsWatch(window=2)
    for _ in range(5):
        assert watch.observe([group([1.0, 1.0]), group([1.0, 1.0])], 0.0) is None
    assert watch.streak == 0


def test_sampled_entropy_is_the_mean_negative_logprob_of_trained_tokens() -> None:
    tied = group([0.0, 0.0], [-0.5, -0.25])
    varied = group([0.0, 1.0], [-2.0, -1.0])
    masked = TrainingSample(prompt_ids=[1], completion_ids=[2, 3], completion_mask=[True, False],
                            inference_logprobs=[-3.0, -100.0], advantages=[0.0, 0.0],
                            policy_versions=[0, 0], temperature=1.0, env="e")  # fmt: skip
    varied.samples.append(masked)
    expected = (2 * 0.75 + 2 * 3.0 + 3.0) / (4 + 4 + 1)
    assert sampled_entropy([tied, varied]) == pytest.approx(expected)


def test_sampled_entropy_estimates_the_entropy_of_the_sampling_distribution() -> None:
    import random

    probabilities = [0.7, 0.2, 0.1]
    entropy = -sum(p * math.log(p) for p in probabilities)
    rng = random.Random(0)
    tokens = rng.choices(range(3), probabilities, k=20_000)
    logprobs = [math.log(probabilities[t]) for t in tokens]
    sample = group([0.0, 1.0], logprobs)
    assert sampled_entropy([sample]) == pytest.approx(entropy, abs=0.01)
