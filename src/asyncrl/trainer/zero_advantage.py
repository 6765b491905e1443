"""Which samples of a batch the trainer computes: not those whose every advantage is 0.

Under the built-in losses a token's loss is a multiple of its advantage, plus a KL term when
one is configured (`beta` to a reference, `kl_tau` toward the inference policy in masked_is).
Without such a term, a sample whose advantages are all 0 — every sample of a group that scored
alike, most of a batch early in a run on a hard task — adds exactly 0 to the step's loss and to
every gradient. Its forward and backward are work for nothing: in the first steps of the
real-model race on an untuned task 91 % of the samples were such, and the trainer spent its
whole step on them. They are left out of the computation but not of the step's totals (the
normalisation still counts them: `micro_batches.py` weighs by the whole batch), so the update
is the one the whole batch gives, up to the order of floating-point sums.

A batch in which no sample carries a gradient still computes its shortest sample: its gradient
is 0 but present, and the optimizer steps as it always did (AdamW's momentum moves the weights
on). So skipping changes the work, not the update — with three exceptions, none in the
built-in recipes: a skipped token whose ratio is not finite would have made the step's loss
NaN and the update be skipped, and now does not; dropout draws other masks; and in a mixture
of experts an expert reached only by skipped tokens gets no gradient instead of a zero one
(AdamW then leaves it alone). Which losses qualify the loss registry says
(`LossSpec.silent_when_zero`: the KL coefficients that must be 0); a loss of the user's own that
does not say computes every sample.
"""

from __future__ import annotations

from asyncrl.config.losses import loss_spec
from asyncrl.config.trainer import LossConfig
from asyncrl.types import TrainingBatch, TrainingSample


def zero_advantage_adds_nothing(loss: LossConfig) -> bool:
    """Whether, under this loss as configured, a token with advantage 0 adds exactly 0 to the
    loss and its gradient."""
    silent = loss_spec(loss.type).silent_when_zero
    if silent is None or loss.entropy_coef != 0.0:  # the entropy term's gradient is everywhere
        return False
    return all(getattr(loss, key, None) == 0.0 for key in silent)


def carries_gradient(sample: TrainingSample) -> bool:
    """A loss token with a nonzero advantage."""
    return any(
        keep and advantage != 0.0
        for keep, advantage in zip(sample.completion_mask, sample.advantages, strict=True)
    )


def samples_to_compute(batch: TrainingBatch, loss: LossConfig) -> list[int]:
    """Indices of the samples the trainer runs forward and backward, in batch order."""
    everything = list(range(len(batch.samples)))
    if not zero_advantage_adds_nothing(loss):
        return everything
    carrying = [i for i in everything if carries_gradient(batch.samples[i])]
    if carrying:
        return carrying
    with_tokens = [i for i in everything if any(batch.samples[i].completion_mask)]
    if not with_tokens:
        return everything  # nothing to train at all: the trainer's empty-step path says so
    shortest = min(with_tokens, key=lambda i: len(batch.samples[i].completion_ids))
    return [shortest]
