"""Group-relative advantages: each completion is scored against the other completions of the
same prompt, so no value model is needed.

- default: A_i = r_i − mean(r) over the group (with `scale_by_std`: divided by std(r) + 1e-6,
  the original GRPO normalisation; off by default, as Dr. GRPO recommends).
- length_weighted_mean: the baseline is the completion-length-weighted mean Σ n_i r_i / Σ n_i.
- custom: a user function named by `import_path` ("package.module:function"), called as
  fn(rewards=[...], lengths=[...], **kwargs) -> advantages; it runs only because the user
  named it in their config.
- process supervision (per-step rewards, `process_advantages`): every step reward of the group
  is normalised by the mean and std of all of them; a token's advantage is the sum of the
  normalised rewards of the steps that end at or after it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from asyncrl.config.import_path import load_function
from asyncrl.config.orchestrator import AdvantageConfig

EPSILON = 1e-6


def group_advantages(
    rewards: Sequence[float], lengths: Sequence[int], config: AdvantageConfig
) -> list[float]:
    """One advantage per completion of a group (the same for all its tokens)."""
    if config.type == "custom":
        return _custom(rewards, lengths, config)
    if config.length_weighted_mean:
        baseline = sum(r * n for r, n in zip(rewards, lengths, strict=True)) / max(1, sum(lengths))
    else:
        baseline = statistics.fmean(rewards)
    advantages = [r - baseline for r in rewards]
    if config.scale_by_std:
        spread = statistics.pstdev(rewards)
        advantages = [a / (spread + EPSILON) for a in advantages]
    return advantages


def _custom(
    rewards: Sequence[float], lengths: Sequence[int], config: AdvantageConfig
) -> list[float]:
    function = load_function(config.import_path or "")
    advantages = list(function(rewards=list(rewards), lengths=list(lengths), **config.kwargs))
    if len(advantages) != len(rewards):
        raise ValueError(
            f"custom advantage `{config.import_path}` returned {len(advantages)} values for "
            f"{len(rewards)} completions"
        )
    if not all(isinstance(a, int | float) and math.isfinite(a) for a in advantages):
        raise ValueError(f"custom advantage `{config.import_path}` returned a non-finite value")
    return [float(a) for a in advantages]


def process_advantages(
    step_rewards: Sequence[Sequence[tuple[int, float]]], lengths: Sequence[int]
) -> list[list[float]]:
    """Per-token advantages of a group from per-step rewards.

    `step_rewards[i]` lists (end token index, reward) for the steps of completion i;
    `lengths[i]` is its number of tokens.
    """
    every = [reward for steps in step_rewards for _, reward in steps]
    mean = statistics.fmean(every) if every else 0.0
    spread = statistics.pstdev(every) if len(every) > 1 else 0.0
    result = []
    for steps, length in zip(step_rewards, lengths, strict=True):
        normalised = [(end, (reward - mean) / (spread + EPSILON)) for end, reward in steps]
        result.append(
            [sum(value for end, value in normalised if end >= token) for token in range(length)]
        )
    return result
