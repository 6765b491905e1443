"""How a loss weighs its tokens over one optimizer step: each loss owns one of these.

A normalisation turns counts over the *whole* step (every micro-batch, every rank) into the
weight w_t of every token of each sequence, so that summing Σ_t w_t · ℓ_t over micro-batches
gives exactly the loss of the whole step and never a mean of means. The micro-batch builder
counts; the normalisation alone decides what to divide by:

- `TOKEN_MEAN`: w_t = 1 / (loss tokens in the step) — DAPO's token-level mean.
- `SEQUENCE_MEAN`: w_t = 1 / (|o_i| · sequences in the step) — GRPO's mean of sequence means.
- `CONSTANT`: w_t = 1 / (sequences in the step · L) — Dr. GRPO's. L is the generation budget
  (`sampling.max_tokens`, which the batch carries), as in the paper and TRL, so the step size
  does not move with the batch; with `loss.dr_grpo_length: longest`, or when the batch has no
  budget, L is the longest completion (loss tokens) of the step. It reads `dr_grpo_length`.

A step with nothing to train has totals of 0 and no tokens to weigh: guarded, not divided by.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from asyncrl.config.losses import NORMALISATION_READS
from asyncrl.config.trainer import LossConfig


@dataclass(frozen=True)
class StepTotals:
    """Counts over the whole optimizer step, the same on every rank and micro-batch."""

    tokens: int  # loss tokens in the step
    sequences: int  # sequences with at least one loss token
    longest: int  # loss tokens of the longest of them (1 when there is none)
    max_tokens: int | None = None  # the generation budget the batch carries, if known


# ([S] loss tokens of each sequence, the step's totals, the loss's config) -> [S] float64 weight
# of every token of each sequence
SequenceWeights = Callable[[torch.Tensor, StepTotals, LossConfig], torch.Tensor]


@dataclass(frozen=True)
class Normalisation:
    """A named way to weigh tokens; `reads` are the `trainer.loss` keys `weights` looks at
    (they count as read by every loss that uses this normalisation)."""

    name: str
    weights: SequenceWeights
    reads: frozenset[str] = field(default_factory=frozenset)

    def __call__(
        self, lengths: torch.Tensor, totals: StepTotals, config: LossConfig
    ) -> torch.Tensor:
        """[S] weight of every token of each sequence (`lengths`: [S] loss tokens); index it
        with `sequence_ids` to get [T]."""
        return self.weights(lengths, totals, config)


def _token_mean(lengths: torch.Tensor, totals: StepTotals, config: LossConfig) -> torch.Tensor:
    return torch.full(lengths.shape, 1.0 / max(totals.tokens, 1), dtype=torch.float64)


def _sequence_mean(lengths: torch.Tensor, totals: StepTotals, config: LossConfig) -> torch.Tensor:
    return 1.0 / (lengths.double() * max(totals.sequences, 1))


def _constant(length: int, lengths: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    return torch.full(lengths.shape, 1.0 / max(totals.sequences * length, 1), dtype=torch.float64)


def _dr_grpo(lengths: torch.Tensor, totals: StepTotals, config: LossConfig) -> torch.Tensor:
    budget = totals.max_tokens if config.dr_grpo_length == "max_tokens" else None
    return _constant(budget or totals.longest, lengths, totals)


def _over_the_longest(
    lengths: torch.Tensor, totals: StepTotals, config: LossConfig
) -> torch.Tensor:
    return _constant(totals.longest, lengths, totals)


TOKEN_MEAN = Normalisation("token", _token_mean)
SEQUENCE_MEAN = Normalisation("sequence", _sequence_mean)
CONSTANT = Normalisation("constant", _dr_grpo, NORMALISATION_READS["constant"])
# what a loss of the registry (`config/losses.py`) means by each name
REGISTERED = {n.name: n for n in (TOKEN_MEAN, SEQUENCE_MEAN, CONSTANT)}

# The normalisations by the names callers used before losses owned theirs: "constant" divides by
# the longest completion, as it did when no budget was passed.
BY_NAME = {
    "token": TOKEN_MEAN,
    "sequence": SEQUENCE_MEAN,
    "constant": Normalisation("constant", _over_the_longest),
}


def normalisation_named(name: str) -> Normalisation:
    if name not in BY_NAME:
        raise ValueError(f"unknown normalisation `{name}`: one of {', '.join(BY_NAME)}")
    return BY_NAME[name]


def sequence_weights(
    kind: str, lengths: torch.Tensor, total_tokens: int, total_sequences: int, length: int
) -> torch.Tensor:
    """[S] weights of the normalisation named `kind` from explicit totals; `length` is the
    constant normalisation's L. The shape of the weights before losses owned their
    normalisation, kept for the exactness tests that build weights by hand."""
    totals = StepTotals(tokens=total_tokens, sequences=total_sequences, longest=length)
    return normalisation_named(kind)(lengths, totals, LossConfig())
