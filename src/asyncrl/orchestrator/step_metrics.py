"""What the orchestrator reports for each batch it hands to the trainer."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence

from asyncrl.orchestrator.group import Group

# staleness is reported per completion-length bucket: long rollouts are the ones that span updates
LENGTH_BUCKETS = (16, 64, 256, 1024)


def length_bucket(length: int) -> str:
    for bound in LENGTH_BUCKETS:
        if length <= bound:
            return f"le_{bound}"
    return f"gt_{LENGTH_BUCKETS[-1]}"


def batch_metrics(
    step: int, groups: Sequence[Group], drops: Counter[str], elapsed: float, temperature: float
) -> dict[str, float]:
    rewards = [r for g in groups for r in g.rewards]
    lengths = [len(s.completion_ids) for g in groups for s in g.samples]
    metrics: dict[str, float] = {
        "orchestrator/reward_mean": statistics.fmean(rewards),
        "orchestrator/reward_std": statistics.pstdev(rewards),
        "orchestrator/reward_max_in_group": statistics.fmean(max(g.rewards) for g in groups),
        "orchestrator/completion_length": statistics.fmean(lengths),
        "orchestrator/truncated_fraction": statistics.fmean(t for g in groups for t in g.truncated),
        "orchestrator/zero_advantage_groups": statistics.fmean(g.zero_advantage for g in groups),
        "orchestrator/sampled_entropy": sampled_entropy(groups),
        "orchestrator/rollouts_per_s": len(rewards) / max(elapsed, 1e-9),
        "orchestrator/tokens_per_s": sum(lengths) / max(elapsed, 1e-9),
        "orchestrator/temperature": temperature,
        "orchestrator/reward_failures": sum(g.reward_failures for g in groups),
        "orchestrator/aborted_retries": sum(g.aborted_retries for g in groups),
        "orchestrator/group/generate_seconds": statistics.fmean(g.generate_seconds for g in groups),
        "orchestrator/group/score_seconds": statistics.fmean(g.score_seconds for g in groups),
    }
    per_function: dict[str, list[float]] = defaultdict(list)
    per_env: dict[str, list[float]] = defaultdict(list)
    staleness: dict[str, list[int]] = defaultdict(list)
    hits: Counter[str] = Counter()
    for group in groups:
        per_env[group.env_name].extend(group.rewards)
        hits.update(group.filter_hits)
        for values in group.values:
            for name, value in values.items():
                per_function[name].append(value)
        for sample in group.samples:
            lag = (step - 1) - min(sample.policy_versions, default=step - 1)
            staleness[length_bucket(len(sample.completion_ids))].append(lag)
    metrics.update(
        {f"orchestrator/reward/{k}": statistics.fmean(v) for k, v in per_function.items()}
    )
    metrics.update(
        {f"orchestrator/env/{k}/reward_mean": statistics.fmean(v) for k, v in per_env.items()}
    )
    metrics.update({f"orchestrator/filter/{k}": v for k, v in hits.items()})
    for bucket, lags in staleness.items():
        metrics[f"orchestrator/staleness/{bucket}/mean"] = statistics.fmean(lags)
        metrics[f"orchestrator/staleness/{bucket}/max"] = max(lags)
    metrics.update({f"orchestrator/dropped/{k}": v for k, v in drops.items()})
    metrics.update(episode_metrics(groups))
    return metrics


def sampled_entropy(groups: Sequence[Group]) -> float:
    """The policy's per-token entropy (nats) as the sampler saw it, estimated over every rollout
    of the batch: the mean of −log p over the sampled tokens, an unbiased estimate of the
    sampling distribution's entropy (at its temperature, after top-k / top-p), since E[−log p(x)]
    is H for x drawn from p. Unlike `trainer/entropy` it includes tied groups, which the trainer
    does not compute, so it shows a collapse the trainer's metric can hide."""
    total = count = 0.0
    for group in groups:
        for sample in group.samples:
            for logprob, kept in zip(
                sample.inference_logprobs, sample.completion_mask, strict=True
            ):
                if kept:
                    total -= logprob
                    count += 1
    return total / count if count else 0.0


def episode_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """Multi-turn episodes: model turns per episode, tokens per turn, turns cut by max_tokens,
    the fraction of episodes each way of ending took (done, max_turns, budget, env_<failure>…),
    and tool
    calls per tool and errors per tool and kind (unparseable, unknown_tool, bad_arguments,
    timeout, raised) in the batch."""
    turns = [n for g in groups for n in g.turns]
    if not turns:
        return {}
    ends: Counter[str] = Counter()
    for group in groups:
        ends.update(group.episode_ends)
    metrics = {
        "orchestrator/episode/turns_mean": statistics.fmean(turns),
        "orchestrator/episode/turns_max": max(turns),
        "orchestrator/episode/turn_length_mean": statistics.fmean(
            n for g in groups for n in g.turn_lengths
        ),
        "orchestrator/episode/cut_turns": sum(g.cut_turns for g in groups),
    }
    metrics.update({f"orchestrator/episode/ended_by/{k}": v / len(turns) for k, v in ends.items()})
    calls: Counter[str] = Counter()
    for group in groups:
        calls.update(group.tool_calls)
    for key, count in calls.items():  # calls per tool, and errors per tool and kind
        name = f"calls/{key}" if "/" not in key else f"errors/{key}"
        metrics[f"orchestrator/tools/{name}"] = count
    return metrics
