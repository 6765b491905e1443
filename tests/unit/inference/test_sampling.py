"""Sampling maths against hand-worked distributions."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.inference.sampling import (
    SamplingParams,
    SequenceView,
    inverse_cdf,
    process_logits,
    sample,
)

EMPTY = torch.zeros(0, dtype=torch.long)


def view(
    params: SamplingParams, history: list[int] | None = None, generated: int = 5
) -> SequenceView:
    return SequenceView(params, torch.tensor(history or [], dtype=torch.long), generated, None)


def test_temperature_divides_logits() -> None:
    logits = torch.tensor([[1.0, 2.0, 4.0]])
    out = process_logits(logits, [view(SamplingParams(temperature=0.5))], eos_token_ids=[])
    assert out.tolist() == [[2.0, 4.0, 8.0]]


def test_greedy_reports_logprobs_at_temperature_one() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)]])  # probabilities 1/4, 3/4
    result = sample(logits, [view(SamplingParams(temperature=0.0))], eos_token_ids=[])
    assert result.tokens.tolist() == [1]
    assert result.logprobs.item() == pytest.approx(math.log(0.75))


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=0.0),
     SamplingParams(temperature=0.7, top_k=2, top_p=0.9, logprobs=2)],
)  # fmt: skip
def test_sampling_leaves_the_callers_logits_as_they_were(params: SamplingParams) -> None:
    """`sample` shifts its processed logits in place: they must be its own, never the caller's
    (the engine passes a view of the head's output, and a failed batch is sampled again row by
    row from the same logits)."""
    logits = torch.tensor([[0.5, 2.0, -1.0, 3.0], [1.0, 1.0, 0.0, -2.0]])
    before = logits.clone()

    sample(logits, [view(params), view(params)], eos_token_ids=[])

    assert torch.equal(logits, before)


def test_top_k_keeps_the_k_best() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    out = process_logits(logits, [view(SamplingParams(top_k=2))], eos_token_ids=[])
    assert torch.isinf(out[0, [0, 3]]).all() and out[0, [1, 2]].tolist() == [3.0, 2.0]


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    # probabilities 0.5, 0.3, 0.15, 0.05 (logits are their logs)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().unsqueeze(0)
    kept = lambda p: ~torch.isinf(process_logits(logits, [view(SamplingParams(top_p=p))], []))  # noqa: E731
    assert kept(0.5)[0].tolist() == [True, False, False, False]  # 0.5 reaches 0.5
    assert kept(0.6)[0].tolist() == [True, True, False, False]  # 0.5 < 0.6 <= 0.8
    assert kept(0.9)[0].tolist() == [True, True, True, False]  # 0.8 < 0.9 <= 0.95
    # logprob of a kept token is renormalised over the kept set
    result = sample(logits, [view(SamplingParams(top_p=0.6, seed=None))], [])
    token = result.tokens.item()
    assert result.logprobs.item() == pytest.approx(math.log(probs[token] / 0.8), abs=1e-6)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = torch.tensor([[2.0, -1.0, 3.0]])
    out = process_logits(
        logits, [view(SamplingParams(repetition_penalty=2.0), history=[0, 1, 1])], []
    )
    assert out.tolist() == [[1.0, -2.0, 3.0]]


def test_min_tokens_bans_end_of_sequence_until_reached() -> None:
    logits = torch.tensor([[0.0, 5.0]])
    params = SamplingParams(min_tokens=3, temperature=0.0)
    early = sample(logits, [view(params, generated=2)], eos_token_ids=[1])
    late = sample(logits, [view(params, generated=3)], eos_token_ids=[1])
    assert early.tokens.item() == 0 and late.tokens.item() == 1


def test_seeded_rows_ignore_the_rest_of_the_batch() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))

    def seeded() -> SequenceView:
        return SequenceView(SamplingParams(seed=9), EMPTY, 0, torch.Generator().manual_seed(9))

    alone = sample(logits[1:2], [seeded()], []).tokens.item()
    for _ in range(5):
        batch = [view(SamplingParams()), seeded(), view(SamplingParams())]
        assert sample(logits, batch, []).tokens[1].item() == alone


def test_sampling_follows_the_distribution() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)]]).repeat(4000, 1)
    rows = [view(SamplingParams()) for _ in range(4000)]
    torch.manual_seed(0)
    share = sample(logits, rows, []).tokens.float().mean().item()
    assert share == pytest.approx(0.75, abs=0.03)  # 4000 draws: std 0.007


def test_draws_follow_a_wide_distribution_and_never_take_a_removed_token() -> None:
    """The inverse-CDF draw against the distribution itself: 20,000 rows over a 300-token
    vocabulary whose top-k keeps 40 tokens (the rest have probability 0)."""
    generator = torch.Generator().manual_seed(1)
    base = torch.randn(1, 300, generator=generator) * 2
    rows = 20_000
    params = SamplingParams(top_k=40, temperature=0.8)
    torch.manual_seed(0)
    result = sample(base.repeat(rows, 1), [view(params) for _ in range(rows)], [])
    expected = torch.softmax(process_logits(base, [view(params)], []), dim=-1)[0]
    counts = torch.bincount(result.tokens, minlength=300).float()
    assert counts[expected == 0].sum() == 0
    kept = expected > 0
    chi_square = ((counts[kept] - rows * expected[kept]) ** 2 / (rows * expected[kept])).sum()
    assert chi_square < 80  # 39 degrees of freedom: the 99.9th percentile is 72.1
    assert torch.allclose(result.logprobs, torch.log(expected[result.tokens]), atol=1e-5)


def full_width_inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The reference: one cumulative sum over the whole vocabulary, inverted at each target."""
    cumulative = weights.cumsum(dim=-1)
    targets = uniform.unsqueeze(1) * cumulative[:, -1:]
    return torch.searchsorted(cumulative, targets, right=True).squeeze(1)


@pytest.mark.parametrize("vocab, block", [(1000, 64), (1000, 7), (96, 32), (5, 1024)])
def test_the_two_level_draw_is_the_full_width_draw(vocab: int, block: int) -> None:
    """Integer weights keep every partial sum exact in float32, so the two-level draw must pick
    exactly the reference's token for every target (blocks of zeros and a padded last block
    included)."""
    generator = torch.Generator().manual_seed(3)
    weights = torch.randint(0, 5, (400, vocab), generator=generator).float()
    weights[:, : vocab // 3] *= torch.rand(400, 1, generator=generator) < 0.5  # empty blocks
    weights[:, 0] += 1  # no row without mass
    uniform = torch.rand(400, generator=generator)
    drawn = inverse_cdf(weights, uniform, block=block)
    assert torch.equal(drawn, full_width_inverse_cdf(weights, uniform))
    assert (weights.gather(1, drawn.unsqueeze(1)) > 0).all()


def test_a_target_at_the_total_takes_the_last_token_with_weight() -> None:
    """uniform × total can round up to the total; trailing zero blocks must not be drawn."""
    weights = torch.zeros(2, 40)
    weights[:, [3, 17]] = 1.0
    drawn = inverse_cdf(weights, torch.tensor([1.0, 0.999]), block=8)
    assert drawn.tolist() == [17, 17]


@pytest.mark.parametrize(
    ("kept", "expected"), [(False, ("1 + 2 = 3\n<answer>3", "</answer>")),
                           (True, ("1 + 2 = 3\n<answer>3</answer>", "</answer>"))],
)  # fmt: skip
def test_a_text_stops_at_its_earliest_stop_string(kept: bool, expected: tuple) -> None:
    """The earliest match wins whatever the list's order (vLLM matches token by token), and the
    stop is kept only when asked (`include_stop_str_in_output`)."""
    params = SamplingParams(stop=["\n\n", "</answer>"], include_stop_str_in_output=kept)
    assert params.stopped_text("1 + 2 = 3\n<answer>3</answer>\n\nIn this sum") == expected
    assert params.stopped_text("1 + 2 = 3") is None
