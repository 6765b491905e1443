from __future__ import annotations

import math

from asyncrl.config.orchestrator import GibberishFilterConfig, RepetitionFilterConfig
from asyncrl.orchestrator.filters import apply_filters, is_gibberish, is_repetitive

VOCAB = 1000  # log(1/1000) = -6.9078


def test_gibberish_needs_a_rare_token_sampled_near_uniform_probability() -> None:
    config = GibberishFilterConfig(token_id_threshold=900, logprob_offset=2.0)  # floor -4.9078
    assert is_gibberish([5, 950], [-0.1, -5.0], VOCAB, config)  # rare and unlikely
    assert not is_gibberish([5, 950], [-0.1, -4.0], VOCAB, config)  # rare but plausible
    assert not is_gibberish([5, 899], [-0.1, -9.0], VOCAB, config)  # unlikely but common id


def test_repetition_needs_a_window_of_confident_tokens() -> None:
    config = RepetitionFilterConfig(window=3, prob_threshold=0.9)
    confident, unsure = math.log(0.95), math.log(0.5)
    assert is_repetitive([confident] * 3, config)
    assert not is_repetitive([confident, confident, unsure, confident, confident], config)
    assert is_repetitive([unsure, confident, confident, confident, unsure], config)


def test_enforce_masks_while_plain_filters_only_count() -> None:
    counting = RepetitionFilterConfig(window=2, prob_threshold=0.9)
    enforcing = RepetitionFilterConfig(window=2, prob_threshold=0.9, enforce=True)
    logprobs = [math.log(0.99)] * 4
    counted = apply_filters([1, 2, 3, 4], logprobs, False, [counting], VOCAB, False)
    assert counted.train and counted.hits == {"repetition": True, "truncated": False}
    masked = apply_filters([1, 2, 3, 4], logprobs, False, [enforcing], VOCAB, False)
    assert not masked.train


def test_truncated_completions_are_masked_only_when_asked() -> None:
    assert apply_filters([1], [-1.0], True, [], VOCAB, mask_truncated=False).train
    outcome = apply_filters([1], [-1.0], True, [], VOCAB, mask_truncated=True)
    assert not outcome.train and outcome.hits["truncated"]
