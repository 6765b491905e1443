"""The GRPO loss family's objectives: each a small function of per-token tensors of one
micro-batch, `(LossInputs, LossConfig) -> LossOutput`. Which loss uses which objective, and how
each weighs its tokens over the step, is the registry's (`loss.py`).

All tensors are flat over the micro-batch's completion tokens, `[T]`. `sequence_ids` says which
sequence each token belongs to (0..S-1 within the micro-batch). `token_weights` carries the
loss's normalisation (`normalisation.py`), computed once for the whole optimizer step (all
micro-batches, all ranks), so that summing `Σ_t w_t · ℓ_t` over micro-batches gives exactly the
loss of the whole step and never a mean of means.

Formulas (lp = trainer logprob, lp_inf = inference logprob, r = exp(lp − lp_inf), A = advantage):

- masked_is: coeff = sg[r_is · (adv_tau·A − kl_tau·(lp − lp_inf))], ℓ = −coeff · lp on kept
  tokens; r_is is r per token, or per sequence exp(Σ log r) clipped at sequence_clip_high.
  A token is dropped when r leaves [token_mask_low, token_mask_high]; a whole sequence when its
  geometric-mean ratio leaves [geo_mask_low, geo_mask_high], or its min / max token ratio falls
  below sequence_mask_low / rises above sequence_mask_high.
- grpo_clip, dapo, dr_grpo: ℓ = −w·min(ρ·A, clip(ρ, 1−ε, 1+ε_high)·A) + β·KL(lp, lp_ref), KL by
  estimator k1 = lp − lp_ref, k2 = ½(lp − lp_ref)², k3 = exp(lp_ref − lp) − (lp_ref − lp) − 1.
  `clip_against: proximal` (the default): ρ = exp(lp − lp_prox), lp_prox the trainer's logprob
  at the start of the batch's updates (= sg[lp] on the first, so ρ = 1 there and the gradient
  is w·A·∇lp), w = sg[min(exp(lp_prox − lp_inf), behaviour_weight_cap)]. `inference`: ρ = r,
  w = 1 — a stale batch's tokens the last update moved most are clipped out.
- gspo: s_i = exp(mean_t(lp − lp_inf)) per sequence, ℓ_i = −min(s_i·A_i, clip(s_i)·A_i), spread
  over the sequence's tokens (plus β·KL per token).
- cispo: ℓ = −sg[min(r, 1+ε_high)] · A · lp (plus β·KL).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.config.trainer import LossConfig


@dataclass
class LossInputs:
    """What a loss is given for one micro-batch: its loss tokens only, flat, in the same order
    in every tensor."""

    logprobs: torch.Tensor  # [T] current policy, with grad
    inference_logprobs: torch.Tensor  # [T] the policy that sampled the tokens
    advantages: torch.Tensor  # [T]
    sequence_ids: torch.Tensor  # [T] long, 0..S-1
    token_weights: torch.Tensor  # [T] step-level normalisation
    ref_logprobs: torch.Tensor | None = None  # [T] reference model, for β·KL
    # [T] the trainer's policy at the start of this batch's updates; None on the first update,
    # where it is the current logprobs themselves (the weights have not moved yet)
    proximal_logprobs: torch.Tensor | None = None
    # [T] the policy's entropy at each token, with grad when the loss has an entropy term
    # (`entropy_coef`, added by `compute_loss` to whichever objective runs)
    entropies: torch.Tensor | None = None


@dataclass
class LossOutput:
    """`loss` is this micro-batch's share of the step's loss (already weighted: the trainer sums
    the shares and calls backward on each); the counts feed `trainer/masked_fraction` and
    `trainer/clip_fraction`."""

    loss: torch.Tensor  # scalar: Σ_t w_t ℓ_t
    masked_tokens: int = 0  # tokens dropped by importance-ratio masks
    clipped_tokens: int = 0  # tokens whose clipped branch was active


def _segment_sum(values: torch.Tensor, ids: torch.Tensor, count: int) -> torch.Tensor:
    return torch.zeros(count, dtype=values.dtype, device=values.device).index_add(0, ids, values)


def _segment_mean(values: torch.Tensor, ids: torch.Tensor, count: int) -> torch.Tensor:
    lengths = torch.bincount(ids, minlength=count).clamp(min=1)
    return _segment_sum(values, ids, count) / lengths


def _kl(inputs: LossInputs, config: LossConfig) -> torch.Tensor:
    if config.beta == 0.0:
        return torch.zeros_like(inputs.logprobs)
    if inputs.ref_logprobs is None:
        raise ValueError("loss.beta > 0 needs reference logprobs")
    difference = inputs.ref_logprobs - inputs.logprobs  # log(π_ref / π)
    if config.kl_estimator == "k1":
        return -difference
    if config.kl_estimator == "k2":
        return 0.5 * difference**2
    return torch.exp(difference) - difference - 1.0


def masked_is_loss(inputs: LossInputs, config: LossConfig) -> LossOutput:
    lp, ids = inputs.logprobs, inputs.sequence_ids
    count = int(ids.max()) + 1 if ids.numel() else 0
    log_ratio = (lp - inputs.inference_logprobs).detach()
    ratio = torch.exp(log_ratio)
    keep = (ratio >= config.token_mask_low) & (ratio <= config.token_mask_high)
    geometric = torch.exp(_segment_mean(log_ratio, ids, count))
    lowest = torch.full(
        (count,), float("inf"), dtype=ratio.dtype, device=ratio.device
    ).scatter_reduce(0, ids, ratio, "amin")
    highest = torch.full(
        (count,), float("-inf"), dtype=ratio.dtype, device=ratio.device
    ).scatter_reduce(0, ids, ratio, "amax")
    keep_sequence = (
        (geometric >= config.geo_mask_low)
        & (geometric <= config.geo_mask_high)
        & (lowest >= config.sequence_mask_low)
        & (highest <= config.sequence_mask_high)
    )
    keep = keep & keep_sequence[ids]
    if config.ratio_type == "sequence":
        sequence_ratio = torch.exp(_segment_sum(log_ratio, ids, count))
        importance = sequence_ratio.clamp(max=config.sequence_clip_high)[ids]
    else:
        importance = ratio
    coefficient = importance * (config.adv_tau * inputs.advantages - config.kl_tau * log_ratio)
    per_token = -(coefficient.detach() * lp)
    loss = (per_token * inputs.token_weights * keep).sum()
    return LossOutput(loss, masked_tokens=int((~keep).sum()))


def clipped_loss(inputs: LossInputs, config: LossConfig) -> LossOutput:
    """grpo_clip, dapo and dr_grpo: one objective, different normalisations. Clipping is
    against the proximal policy by default: it bounds how far this batch's updates move the
    policy, while the sampler's distance from it (staleness under asynchrony) is an importance
    weight, not a reason to drop a token's gradient."""
    if config.clip_against == "proximal":
        proximal = inputs.proximal_logprobs
        if proximal is None:
            proximal = inputs.logprobs.detach()
        ratio = torch.exp(inputs.logprobs - proximal)
        behaviour = torch.exp(proximal - inputs.inference_logprobs)
        weight = behaviour.clamp(max=config.behaviour_weight_cap).detach()
    else:
        ratio = torch.exp(inputs.logprobs - inputs.inference_logprobs)
        weight = torch.ones_like(ratio)
    low, high = 1.0 - config.epsilon, 1.0 + (config.epsilon_high or config.epsilon)
    advantages = inputs.advantages
    unclipped = ratio * advantages
    clipped = ratio.clamp(low, high) * advantages
    per_token = -weight * torch.minimum(unclipped, clipped) + config.beta * _kl(inputs, config)
    was_clipped = ((ratio < low) & (advantages < 0)) | ((ratio > high) & (advantages > 0))
    return LossOutput(
        (per_token * inputs.token_weights).sum(), clipped_tokens=int(was_clipped.sum())
    )


def gspo_loss(inputs: LossInputs, config: LossConfig) -> LossOutput:
    ids = inputs.sequence_ids
    count = int(ids.max()) + 1 if ids.numel() else 0
    log_ratio = _segment_mean(inputs.logprobs - inputs.inference_logprobs, ids, count)
    ratio = torch.exp(log_ratio)  # [S]
    advantages = _segment_mean(inputs.advantages, ids, count)
    low, high = 1.0 - config.epsilon, 1.0 + (config.epsilon_high or config.epsilon)
    per_sequence = -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)
    per_token = per_sequence[ids] + config.beta * _kl(inputs, config)
    was_clipped = ((ratio < low) & (advantages < 0)) | ((ratio > high) & (advantages > 0))
    return LossOutput(
        (per_token * inputs.token_weights).sum(),
        clipped_tokens=int(was_clipped[ids].sum()),
    )


def cispo_loss(inputs: LossInputs, config: LossConfig) -> LossOutput:
    ratio = torch.exp(inputs.logprobs - inputs.inference_logprobs).detach()
    high = 1.0 + (config.epsilon_high or config.epsilon)
    weight = ratio.clamp(max=high)
    per_token = -(weight * inputs.advantages * inputs.logprobs) + config.beta * _kl(inputs, config)
    return LossOutput(
        (per_token * inputs.token_weights).sum(), clipped_tokens=int((ratio > high).sum())
    )
