"""Rollout filters. A flagged rollout is counted in metrics; with `enforce` it is also masked
out of the training loss (its completion mask set to false). Truncated completions (stopped by
`max_tokens`) can be masked the same way (`mask_truncated_completions`, DAPO's overlong filter).

- gibberish: a token whose id is at least `token_id_threshold` (rare, late-vocabulary tokens)
  sampled with a logprob below log(1/vocab) + `logprob_offset`, i.e. barely likelier than
  uniform noise.
- repetition: `window` consecutive tokens each sampled with probability above
  `prob_threshold` — the model is looping on something it is certain of.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from asyncrl.config.orchestrator import GibberishFilterConfig, RepetitionFilterConfig


def is_gibberish(
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    vocab_size: int,
    config: GibberishFilterConfig,
) -> bool:
    floor = -math.log(vocab_size) + config.logprob_offset
    return any(
        token >= config.token_id_threshold and logprob < floor
        for token, logprob in zip(token_ids, logprobs, strict=True)
    )


def is_repetitive(logprobs: Sequence[float], config: RepetitionFilterConfig) -> bool:
    threshold = math.log(config.prob_threshold)
    run = 0
    for logprob in logprobs:
        run = run + 1 if logprob > threshold else 0
        if run >= config.window:
            return True
    return False


@dataclass
class FilterOutcome:
    train: bool = True  # False: mask the whole completion out of the loss
    hits: dict[str, bool] = field(default_factory=dict)  # filter name -> flagged


def apply_filters(
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    truncated: bool,
    filters: Sequence[GibberishFilterConfig | RepetitionFilterConfig],
    vocab_size: int,
    mask_truncated: bool,
) -> FilterOutcome:
    outcome = FilterOutcome()
    for config in filters:
        if isinstance(config, GibberishFilterConfig):
            flagged = is_gibberish(token_ids, logprobs, vocab_size, config)
        else:
            flagged = is_repetitive(logprobs, config)
        outcome.hits[config.type] = outcome.hits.get(config.type, False) or flagged
        if flagged and config.enforce:
            outcome.train = False
    outcome.hits["truncated"] = truncated
    if truncated and mask_truncated:
        outcome.train = False
    return outcome
