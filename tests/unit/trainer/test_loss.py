"""Each loss against a hand-written reference: plain loops over sequences and tokens, no shared
helpers, float64; loss value and gradient with respect to the trainer logprobs to 1e-6."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.config.trainer import LossConfig
from asyncrl.trainer.loss import NORMALISATION, LossInputs, compute_loss, sequence_weights

LENGTHS = [4, 2, 5, 3]


def case(seed: int, spread: float) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    total = sum(LENGTHS)
    logprobs = -3 * torch.rand(total, generator=generator, dtype=torch.float64)
    inference = logprobs + spread * torch.randn(total, generator=generator, dtype=torch.float64)
    reference = logprobs + 0.3 * torch.randn(total, generator=generator, dtype=torch.float64)
    per_sequence = torch.randn(len(LENGTHS), generator=generator, dtype=torch.float64)
    advantages = per_sequence.repeat_interleave(torch.tensor(LENGTHS))
    return {"lp": logprobs, "inf": inference, "ref": reference, "adv": advantages}


def ours(data: dict[str, torch.Tensor], config: LossConfig) -> tuple[float, torch.Tensor, object]:
    logprobs = data["lp"].clone().requires_grad_(True)
    lengths = torch.tensor(LENGTHS)
    inputs = LossInputs(
        logprobs=logprobs,
        inference_logprobs=data["inf"],
        advantages=data["adv"],
        sequence_ids=torch.arange(len(LENGTHS)).repeat_interleave(lengths),
        token_weights=sequence_weights(
            NORMALISATION[config.type], lengths, sum(LENGTHS), len(LENGTHS), max(LENGTHS)
        ).repeat_interleave(lengths),
        ref_logprobs=data["ref"],
        proximal_logprobs=data.get("prox"),
    )
    output = compute_loss(inputs, config)
    output.loss.backward()
    return output.loss.item(), logprobs.grad, output


def sequences() -> list[list[int]]:
    """Token indices of each sequence."""
    out, start = [], 0
    for length in LENGTHS:
        out.append(list(range(start, start + length)))
        start += length
    return out


def reference_masked_is(data: dict[str, torch.Tensor], c: LossConfig) -> tuple[torch.Tensor, int]:
    lp = data["lp"].clone().requires_grad_(True)
    total_tokens = sum(LENGTHS)
    loss = torch.zeros((), dtype=torch.float64)
    masked = 0
    for tokens in sequences():
        log_ratios = [float(lp[t].detach() - data["inf"][t]) for t in tokens]
        ratios = [math.exp(x) for x in log_ratios]
        geometric = math.exp(sum(log_ratios) / len(tokens))
        sequence_ok = (
            c.geo_mask_low <= geometric <= c.geo_mask_high
            and min(ratios) >= c.sequence_mask_low
            and max(ratios) <= c.sequence_mask_high
        )
        sequence_ratio = min(math.exp(sum(log_ratios)), c.sequence_clip_high)
        for k, t in enumerate(tokens):
            if not (sequence_ok and c.token_mask_low <= ratios[k] <= c.token_mask_high):
                masked += 1
                continue
            importance = sequence_ratio if c.ratio_type == "sequence" else ratios[k]
            coefficient = importance * (
                c.adv_tau * float(data["adv"][t]) - c.kl_tau * log_ratios[k]
            )
            loss = loss + (-coefficient * lp[t]) / total_tokens
    loss.backward()
    return loss, lp.grad, masked


def reference_clipped(data: dict[str, torch.Tensor], c: LossConfig) -> tuple[torch.Tensor, int]:
    lp = data["lp"].clone().requires_grad_(True)
    high = c.epsilon_high or c.epsilon
    count, total, longest = len(LENGTHS), sum(LENGTHS), max(LENGTHS)
    loss = torch.zeros((), dtype=torch.float64)
    clipped = 0
    for tokens in sequences():
        for t in tokens:
            if c.clip_against == "proximal":  # the batch's starting policy; w corrects the sampler
                proximal = lp[t].detach() if data.get("prox") is None else data["prox"][t]
                ratio = torch.exp(lp[t] - proximal)
                weight = min(math.exp(float(proximal - data["inf"][t])), c.behaviour_weight_cap)
            else:
                ratio, weight = torch.exp(lp[t] - data["inf"][t]), 1.0
            advantage = data["adv"][t]
            term = -weight * torch.minimum(
                ratio * advantage, ratio.clamp(1 - c.epsilon, 1 + high) * advantage
            )
            if (ratio < 1 - c.epsilon and advantage < 0) or (ratio > 1 + high and advantage > 0):
                clipped += 1
            if c.beta:
                d = data["ref"][t] - lp[t]
                kl = {"k1": -d, "k2": 0.5 * d * d, "k3": torch.exp(d) - d - 1}[c.kl_estimator]
                term = term + c.beta * kl
            weight = {
                "grpo_clip": 1.0 / (len(tokens) * count),
                "dapo": 1.0 / total,
                "dr_grpo": 1.0 / (count * longest),
            }[c.type]
            loss = loss + weight * term
    loss.backward()
    return loss, lp.grad, clipped


def reference_gspo(data: dict[str, torch.Tensor], c: LossConfig) -> tuple[torch.Tensor, int]:
    lp = data["lp"].clone().requires_grad_(True)
    high = c.epsilon_high or c.epsilon
    loss = torch.zeros((), dtype=torch.float64)
    clipped = 0
    for tokens in sequences():
        mean_log_ratio = sum(lp[t] - data["inf"][t] for t in tokens) / len(tokens)
        ratio = torch.exp(mean_log_ratio)
        advantage = data["adv"][tokens[0]]
        term = -torch.minimum(ratio * advantage, ratio.clamp(1 - c.epsilon, 1 + high) * advantage)
        if (ratio < 1 - c.epsilon and advantage < 0) or (ratio > 1 + high and advantage > 0):
            clipped += len(tokens)
        loss = loss + term / len(LENGTHS)
    loss.backward()
    return loss, lp.grad, clipped


def reference_cispo(data: dict[str, torch.Tensor], c: LossConfig) -> tuple[torch.Tensor, int]:
    lp = data["lp"].clone().requires_grad_(True)
    high = 1 + (c.epsilon_high or c.epsilon)
    loss = torch.zeros((), dtype=torch.float64)
    clipped = 0
    for tokens in sequences():
        for t in tokens:
            ratio = math.exp(float(lp[t].detach() - data["inf"][t]))
            clipped += ratio > high
            weight = min(ratio, high)  # a plain float: no gradient through the IS weight
            loss = loss - weight * float(data["adv"][t]) * lp[t] / sum(LENGTHS)
    loss.backward()
    return loss, lp.grad, clipped


MASKED_IS_CASES = {
    "defaults": ({}, "none"),
    "token_masks_fire": ({"token_mask_low": 0.8, "token_mask_high": 1.25}, "masked"),
    "geometric_masks_fire": ({"geo_mask_low": 0.85, "geo_mask_high": 1.15}, "masked"),
    "sequence_masks_fire": ({"sequence_mask_low": 0.6, "sequence_mask_high": 1.6}, "masked"),
    "sequence_ratio_clipped": ({"ratio_type": "sequence", "sequence_clip_high": 1.2}, "none"),
    "kl_and_adv_tau": ({"kl_tau": 0.3, "adv_tau": 0.5}, "none"),
}


@pytest.mark.parametrize("name", list(MASKED_IS_CASES))
def test_masked_is_matches_reference(name: str) -> None:
    overrides, expect = MASKED_IS_CASES[name]
    config = LossConfig(type="masked_is", **overrides)
    data = case(seed=1, spread=0.4)
    value, grad, output = ours(data, config)
    expected, expected_grad, masked = reference_masked_is(data, config)
    assert value == pytest.approx(expected.item(), abs=1e-6)
    assert torch.allclose(grad, expected_grad, atol=1e-6)
    assert output.masked_tokens == masked
    if expect == "masked":
        assert 0 < masked < sum(LENGTHS)  # the mask under test really fired, and not on all


INFERENCE = {"clip_against": "inference"}
# (config, whether a later update's proximal logprobs are given); clipping fires in each case
# but the first update against the proximal policy, where the ratio is 1
CLIPPED_CASES = {
    "grpo_clip_k3": ({"type": "grpo_clip", "beta": 0.04, "kl_estimator": "k3", **INFERENCE}, False),
    "grpo_clip_k1": ({"type": "grpo_clip", "beta": 0.1, "kl_estimator": "k1", **INFERENCE}, False),
    "grpo_clip_k2": ({"type": "grpo_clip", "beta": 0.1, "kl_estimator": "k2", **INFERENCE}, False),
    "dapo_clip_higher": ({"type": "dapo", "epsilon_high": 0.28, **INFERENCE}, False),
    "dr_grpo": ({"type": "dr_grpo", **INFERENCE}, False),
    "grpo_clip_proximal_first_update": ({"type": "grpo_clip", "beta": 0.04}, False),
    "dapo_proximal_later_update": (
        {"type": "dapo", "epsilon_high": 0.28, "behaviour_weight_cap": 1.3},
        True,
    ),
    "dr_grpo_proximal_later_update": ({"type": "dr_grpo"}, True),
}


@pytest.mark.parametrize("name", list(CLIPPED_CASES))
def test_clipped_losses_match_reference(name: str) -> None:
    overrides, later_update = CLIPPED_CASES[name]
    config = LossConfig(**overrides)
    data = case(seed=2, spread=0.4)
    if later_update:  # the weights moved since the batch's first update
        data["prox"] = data["lp"] + 0.3 * torch.randn(
            sum(LENGTHS), generator=torch.Generator().manual_seed(9), dtype=torch.float64
        )
    value, grad, output = ours(data, config)
    expected, expected_grad, clipped = reference_clipped(data, config)
    assert value == pytest.approx(expected.item(), abs=1e-6)
    assert torch.allclose(grad, expected_grad, atol=1e-6)
    first_proximal = config.clip_against == "proximal" and not later_update
    assert output.clipped_tokens == clipped and (clipped == 0) == first_proximal


def test_a_stale_token_keeps_its_gradient_when_clipping_is_against_the_proximal_policy() -> None:
    """A token sampled one version behind whose probability the last update raised by half
    (ratio 1.5 to the sampler, A > 0): clipped against the sampler it teaches nothing; against
    the proximal policy its gradient is A·w·∇lp with w = 1.5. On policy (ratio 1) the two agree."""
    for sampler_ratio, proximal_grad, inference_grad in [(1.5, -1.5, 0.0), (1.0, -1.0, -1.0)]:
        grads = []
        for against in ["proximal", "inference"]:
            lp = torch.tensor([0.0], dtype=torch.float64, requires_grad=True)
            inputs = LossInputs(
                lp, torch.tensor([-math.log(sampler_ratio)], dtype=torch.float64),
                torch.ones(1, dtype=torch.float64), torch.tensor([0]),
                torch.ones(1, dtype=torch.float64),
            )  # fmt: skip
            compute_loss(inputs, LossConfig(type="grpo_clip", clip_against=against)).loss.backward()
            grads.append(lp.grad.item())
        assert grads == pytest.approx([proximal_grad, inference_grad])


def test_clip_higher_hand_worked() -> None:
    """ratio 1.25 with A > 0: clipped by ε = 0.2, not by ε_high = 0.3; ratio 0.75 with A < 0:
    below 1 − ε = 0.8, clipped either way. Clipped tokens get no gradient."""
    logprobs = torch.log(torch.tensor([1.25, 0.75], dtype=torch.float64))
    data = {
        "lp": logprobs,
        "inf": torch.zeros(2, dtype=torch.float64),
        "adv": torch.tensor([1.0, -1.0], dtype=torch.float64),
    }

    def run(config: LossConfig) -> tuple[float, torch.Tensor, int]:
        lp = data["lp"].clone().requires_grad_(True)
        inputs = LossInputs(
            lp, data["inf"], data["adv"], torch.tensor([0, 1]),
            torch.full((2,), 0.5, dtype=torch.float64),
        )  # fmt: skip
        output = compute_loss(inputs, config)
        output.loss.backward()
        return output.loss.item(), lp.grad, output.clipped_tokens

    value, grad, clipped = run(LossConfig(type="dapo", epsilon=0.2, **INFERENCE))
    assert clipped == 2 and value == pytest.approx(0.5 * (-1.2 + 0.8))
    assert grad.tolist() == [0.0, 0.0]
    value, grad, clipped = run(LossConfig(type="dapo", epsilon=0.2, epsilon_high=0.3, **INFERENCE))
    assert clipped == 1 and value == pytest.approx(0.5 * (-1.25 + 0.8))
    assert grad[0].item() == pytest.approx(-0.5 * 1.25) and grad[1].item() == 0.0  # d(r)/d(lp) = r


def test_gspo_matches_reference() -> None:
    config = LossConfig(type="gspo", epsilon=0.05)
    data = case(seed=3, spread=0.2)
    value, grad, output = ours(data, config)
    expected, expected_grad, clipped = reference_gspo(data, config)
    assert value == pytest.approx(expected.item(), abs=1e-6)
    assert torch.allclose(grad, expected_grad, atol=1e-6)
    assert output.clipped_tokens == clipped > 0


def test_cispo_matches_reference_and_passes_gradient_through_clipped_tokens() -> None:
    config = LossConfig(type="cispo", epsilon=0.2, epsilon_high=0.1)
    data = case(seed=4, spread=0.4)
    value, grad, output = ours(data, config)
    expected, expected_grad, clipped = reference_cispo(data, config)
    assert value == pytest.approx(expected.item(), abs=1e-6)
    assert torch.allclose(grad, expected_grad, atol=1e-6)
    assert output.clipped_tokens == clipped > 0
    assert (grad != 0).all()  # unlike PPO clipping, no token loses its gradient


@pytest.mark.parametrize("loss_type", list(NORMALISATION))
def test_micro_batches_sum_to_the_whole_step(loss_type: str) -> None:
    """Normalisation is over the step: splitting it into micro-batches changes nothing."""
    config = LossConfig(type=loss_type, epsilon=0.2, beta=0.05 if loss_type != "masked_is" else 0)
    data = case(seed=5, spread=0.3)
    whole, whole_grad, _ = ours(data, config)
    kind = NORMALISATION[loss_type]
    split = [LENGTHS[:1], LENGTHS[1:]]  # a 4-token micro-batch and a 10-token one
    total = torch.zeros((), dtype=torch.float64)
    grads, start = [], 0
    for part in split:
        size = sum(part)
        lp = data["lp"][start : start + size].clone().requires_grad_(True)
        lengths = torch.tensor(part)
        inputs = LossInputs(
            logprobs=lp,
            inference_logprobs=data["inf"][start : start + size],
            advantages=data["adv"][start : start + size],
            sequence_ids=torch.arange(len(part)).repeat_interleave(lengths),
            token_weights=sequence_weights(
                kind, lengths, sum(LENGTHS), len(LENGTHS), max(LENGTHS)
            ).repeat_interleave(lengths),
            ref_logprobs=data["ref"][start : start + size],
        )
        loss = compute_loss(inputs, config).loss
        loss.backward()
        total = total + loss.detach()
        grads.append(lp.grad)
        start += size
    assert total.item() == pytest.approx(whole, abs=1e-9)
    assert torch.allclose(torch.cat(grads), whole_grad, atol=1e-9)


@pytest.mark.parametrize("loss_type", list(NORMALISATION))
def test_entropy_bonus_is_the_loss_minus_coef_times_the_weighted_entropy(loss_type: str) -> None:
    """`entropy_coef` adds − coef · Σ_t w_t H_t to every loss, weighted by the loss's own
    normalisation (by hand: per sequence mean entropy over sequences for the sequence-mean
    losses, token mean else), and its gradient reaches the entropies; the policy term is
    unchanged."""
    data = case(seed=4, spread=0.2)
    entropies = torch.rand(sum(LENGTHS), generator=torch.Generator().manual_seed(5),
                           dtype=torch.float64) * 2  # fmt: skip
    plain = LossConfig(type=loss_type)
    with_bonus = LossConfig(type=loss_type, entropy_coef=0.05)
    lengths = torch.tensor(LENGTHS)
    weights = sequence_weights(
        NORMALISATION[loss_type], lengths, sum(LENGTHS), len(LENGTHS), max(LENGTHS)
    ).repeat_interleave(lengths)

    def run(config: LossConfig) -> tuple[float, torch.Tensor, torch.Tensor]:
        logprobs = data["lp"].clone().requires_grad_(True)
        entropy = entropies.clone().requires_grad_(True)
        inputs = LossInputs(
            logprobs=logprobs, inference_logprobs=data["inf"], advantages=data["adv"],
            sequence_ids=torch.arange(len(LENGTHS)).repeat_interleave(lengths),
            token_weights=weights, ref_logprobs=data["ref"], entropies=entropy,
        )  # fmt: skip
        loss = compute_loss(inputs, config).loss
        loss.backward()
        return loss.item(), logprobs.grad, entropy.grad  # type: ignore[return-value]

    base, base_grad, no_entropy_grad = run(plain)
    value, grad, entropy_grad = run(with_bonus)
    if NORMALISATION[loss_type] == "sequence":
        by_hand = sum(float(entropies[t].sum()) / len(t) for t in map(torch.tensor, sequences()))
        by_hand /= len(LENGTHS)
    elif NORMALISATION[loss_type] == "token":
        by_hand = float(entropies.sum()) / sum(LENGTHS)
    else:  # constant: sequences · max_tokens (here the longest)
        by_hand = float(entropies.sum()) / (len(LENGTHS) * max(LENGTHS))
    assert value == pytest.approx(base - 0.05 * by_hand, abs=1e-9)
    assert torch.allclose(grad, base_grad, atol=1e-12)
    assert no_entropy_grad is None
    assert torch.allclose(entropy_grad, -0.05 * weights, atol=1e-12)


def test_entropy_bonus_without_differentiable_entropies_is_refused() -> None:
    data = case(seed=4, spread=0.2)
    lengths = torch.tensor(LENGTHS)
    inputs = LossInputs(
        logprobs=data["lp"].clone().requires_grad_(True), inference_logprobs=data["inf"],
        advantages=data["adv"], sequence_ids=torch.arange(len(LENGTHS)).repeat_interleave(lengths),
        token_weights=torch.ones(sum(LENGTHS), dtype=torch.float64),
        entropies=torch.rand(sum(LENGTHS), dtype=torch.float64),
    )  # fmt: skip
    with pytest.raises(ValueError, match="entropy_coef"):
        compute_loss(inputs, LossConfig(type="grpo_clip", entropy_coef=0.01))


@pytest.mark.parametrize("loss_type", ["grpo_clip", "masked_is", "cispo"])
def test_covariance_clipping_removes_the_gradient_of_the_top_covariance_tokens(
    loss_type: str,
) -> None:
    """Clip-Cov by hand: the ⌊fraction·T⌋ tokens of largest (lp − mean lp)(A − mean A) keep
    their term's value and get no gradient; every other token's gradient is unchanged."""
    data = case(seed=6, spread=0.1)
    fraction = 0.3
    plain_value, plain_grad, _ = ours(data, LossConfig(type=loss_type))
    value, grad, _ = ours(data, LossConfig(type=loss_type, cov_clip_fraction=fraction))
    lp, adv = data["lp"], data["adv"]
    covariance = [(float(lp[t]) - float(lp.mean())) * (float(adv[t]) - float(adv.mean()))
                  for t in range(len(lp))]  # fmt: skip
    count = int(fraction * len(lp))
    chosen = sorted(range(len(lp)), key=lambda t: -covariance[t])[:count]
    assert count > 0
    assert value == pytest.approx(plain_value, abs=1e-12)
    for t in range(len(lp)):
        expected = 0.0 if t in chosen else float(plain_grad[t])
        assert float(grad[t]) == pytest.approx(expected, abs=1e-12)
    assert any(float(plain_grad[t]) != 0.0 for t in chosen)  # it did remove something


def test_entropy_weight_follows_the_batchs_sampled_entropy_below_the_target() -> None:
    from types import SimpleNamespace

    from asyncrl.trainer.parallel import SINGLE_PROCESS
    from asyncrl.trainer.train import entropy_weight

    def batch(*logprobs: list[float]) -> list[SimpleNamespace]:
        return [SimpleNamespace(inference_logprobs=torch.tensor(lp), num_loss_tokens=len(lp))
                for lp in logprobs]  # fmt: skip

    config = LossConfig(type="grpo_clip", entropy_coef=0.2, entropy_target=0.4)
    # mean −log p over both micro-batches: (0.1 + 0.3 + 0.2) / 3 = 0.2, half the target
    weight = entropy_weight(batch([-0.1, -0.3], [-0.2]), config, SINGLE_PROCESS)  # type: ignore[arg-type]
    assert weight == pytest.approx(0.2 * (1 - 0.2 / 0.4))
    assert entropy_weight(batch([-0.5, -0.7]), config, SINGLE_PROCESS) == 0.0  # type: ignore[arg-type]
    fixed = LossConfig(type="grpo_clip", entropy_coef=0.2)
    assert entropy_weight(batch([-0.5]), fixed, SINGLE_PROCESS) == 0.2  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="entropy_coef"):
        LossConfig(type="grpo_clip", entropy_target=0.4)
