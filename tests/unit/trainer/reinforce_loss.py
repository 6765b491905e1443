"""A user's losses, as `loss.type` names them by import path (test_loss_registry.py): plain
REINFORCE, ℓ_t = −A_t · lp_t, no importance ratio. Not collected: no `test_` prefix."""

from __future__ import annotations

from asyncrl.config.losses import LossSpec
from asyncrl.config.trainer import LossConfig
from asyncrl.trainer.loss import SEQUENCE_MEAN, Loss, LossInputs, LossOutput


def reinforce(inputs: LossInputs, config: LossConfig) -> LossOutput:
    """A plain objective: the token-level mean, no key read."""
    per_token = -(inputs.advantages * inputs.logprobs)
    return LossOutput((per_token * inputs.token_weights).sum())


def _scaled_reinforce(inputs: LossInputs, config: LossConfig) -> LossOutput:
    per_token = -(config.adv_tau * inputs.advantages * inputs.logprobs)
    return LossOutput((per_token * inputs.token_weights).sum())


# a `Loss`: a mean of sequence means, reading `adv_tau` (and nothing else)
SCALED_BY_SEQUENCE = Loss(
    "scaled_reinforce", _scaled_reinforce, SEQUENCE_MEAN, reads=frozenset({"adv_tau"})
)

NOT_A_LOSS = 3

# the same declaration, torch-free: the objective by import path, imported by the trainer only
SCALED_SPEC = LossSpec(
    "scaled_reinforce", f"{__name__}:_scaled_reinforce", "sequence", frozenset({"adv_tau"})
)

# the same, saying a token with advantage 0 adds nothing whatever the keys (no KL term): the
# trainer may skip samples whose advantages are all 0 (`trainer/zero_advantage.py`)
SILENT_SPEC = LossSpec(
    "scaled_reinforce", f"{__name__}:_scaled_reinforce", "sequence", frozenset({"adv_tau"}),
    silent_when_zero=frozenset(),
)  # fmt: skip
