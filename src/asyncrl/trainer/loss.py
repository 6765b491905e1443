"""The losses the trainer trains with: each entry of the loss registry (`config/losses.py`:
objective, normalisation and keys, one entry per loss) resolved to the functions that compute
it. Nothing here decides which normalisation a loss has: the micro-batch builder is handed
`loss_named(config.type).normalisation`, and a config is checked against the registry when it
loads (docs/training.md, Writing a loss).

The objectives' formulas are in `objectives.py`, the normalisations in `normalisation.py`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from asyncrl.config.base import ConfigError
from asyncrl.config.import_path import load_function, load_object
from asyncrl.config.losses import BUILT_IN as BUILT_IN_SPECS
from asyncrl.config.losses import LossSpec, loss_spec, readers_of
from asyncrl.config.trainer import LossConfig
from asyncrl.trainer.normalisation import (
    CONSTANT,
    REGISTERED,
    SEQUENCE_MEAN,
    TOKEN_MEAN,
    Normalisation,
    sequence_weights,
)
from asyncrl.trainer.objectives import LossInputs, LossOutput

__all__ = [
    "BUILT_IN",
    "CONSTANT",
    "NORMALISATION",
    "SEQUENCE_MEAN",
    "TOKEN_MEAN",
    "Loss",
    "LossInputs",
    "LossOutput",
    "Normalisation",
    "compute_loss",
    "loss_named",
    "readers_of",
    "sequence_weights",
]

Objective = Callable[[LossInputs, LossConfig], LossOutput]


@dataclass(frozen=True)
class Loss:
    """A loss: `objective` computes one micro-batch's share of the step's loss from tokens
    already weighted by `normalisation`; `reads` are the `trainer.loss` keys the objective
    looks at (`type` aside). A key outside `keys_read` that a config sets away from its
    default is refused when the config loads, so a setting never silently does nothing."""

    name: str
    objective: Objective
    normalisation: Normalisation = TOKEN_MEAN
    reads: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reads", frozenset(self.reads))  # a set or tuple will do
        unknown = sorted(self.keys_read - set(LossConfig.model_fields))
        if unknown:
            raise ConfigError(
                f"loss `{self.name}` says it reads {', '.join(f'`{k}`' for k in unknown)}: not "
                f"`trainer.loss` keys (those are {', '.join(LossConfig.model_fields)})"
            )

    @property
    def keys_read(self) -> frozenset[str]:
        """Every key this loss reads: its objective's and its normalisation's."""
        return self.reads | self.normalisation.reads

    def __call__(self, inputs: LossInputs, config: LossConfig) -> LossOutput:
        return self.objective(inputs, config)


def resolved(spec: LossSpec) -> Loss:
    """A registry entry with its objective imported and its normalisation looked up."""
    objective = load_function(spec.objective)
    return Loss(spec.name, objective, REGISTERED[spec.normalisation], spec.reads)


BUILT_IN: dict[str, Loss] = {name: resolved(spec) for name, spec in BUILT_IN_SPECS.items()}

# each built-in loss's normalisation by name ("token", "sequence", "constant"), as the tests
# that build weights by hand (`sequence_weights`) name them
NORMALISATION = {name: loss.normalisation.name for name, loss in BUILT_IN.items()}


@functools.cache
def loss_named(name: str) -> Loss:
    """The loss `loss.type` names (see `config/losses.py`: a built-in, or by import path a
    `LossSpec`, a `Loss` or a plain objective); a ConfigError says what would do. Cached: the
    trainer asks once per micro-batch."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    spec = loss_spec(name)
    found = load_object(name)
    return found if isinstance(found, Loss) else resolved(spec)


def compute_loss(inputs: LossInputs, config: LossConfig) -> LossOutput:
    """One micro-batch's share of the step's loss under the configured loss, with the terms
    every loss may have: Clip-Cov (`cov_clip_fraction`: the tokens of largest covariance
    between logprob and advantage lose their gradient, `covariance_clipped`) and the entropy
    bonus where `entropy_coef` > 0: − coef · Σ_t w_t · H_t, the entropies weighted as the loss
    weighs its tokens (so it is the step's mean entropy under the loss's normalisation)."""
    if config.cov_clip_fraction > 0.0:
        inputs = covariance_clipped(inputs, config.cov_clip_fraction)
    output = loss_named(config.type)(inputs, config)
    if config.entropy_coef > 0.0:
        if inputs.entropies is None or not inputs.entropies.requires_grad:
            raise ValueError("loss.entropy_coef > 0 needs the entropies with their gradient")
        bonus = (inputs.entropies * inputs.token_weights).sum()
        output.loss = output.loss - config.entropy_coef * bonus
    return output


def covariance_clipped(inputs: LossInputs, fraction: float) -> LossInputs:
    """`inputs` with the logprobs of the `fraction` of tokens of largest covariance
    (lp − mean lp)·(A − mean A) detached: their terms keep their value and lose their gradient.
    Under policy gradient a token's entropy change goes as −Cov(log π, π·A) (Cui et al. 2025),
    so these — a likely token reinforced, an unlikely one punished — are the updates that
    sharpen the policy most; the others (a likely token punished, an unlikely one reinforced)
    keep it exploring. Means are over the micro-batch's loss tokens."""
    logprobs = inputs.logprobs
    count = int(fraction * logprobs.numel())
    if count == 0:
        return inputs
    detached = logprobs.detach()
    covariance = (detached - detached.mean()) * (inputs.advantages - inputs.advantages.mean())
    chosen = torch.zeros_like(detached, dtype=torch.bool)
    chosen[torch.topk(covariance, count).indices] = True
    return dataclasses.replace(inputs, logprobs=torch.where(chosen, detached, logprobs))
