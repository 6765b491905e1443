"""The few-pass log-probability and entropy against plain `log_softmax` in float64."""

from __future__ import annotations

import pytest
import torch

from asyncrl.trainer.token_softmax import _TokenLogprobEntropy, token_logprob_entropy


def _case(tokens: int, vocab: int, scale: float, seed: int):  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, vocab, generator=generator, dtype=torch.float64) * scale
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    temperature = torch.rand(tokens, generator=generator, dtype=torch.float64) * 1.5 + 0.2
    return logits, targets, temperature


def _reference(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor):  # type: ignore[no-untyped-def]
    log_probs = torch.log_softmax(logits / temperature.unsqueeze(-1), dim=-1)
    picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return picked, entropy


@pytest.mark.parametrize(("scale", "seed"), [(1.0, 0), (30.0, 1)])  # 30: logits far apart
def test_values_and_gradient_equal_log_softmax(scale: float, seed: int) -> None:
    logits, targets, temperature = _case(13, 257, scale, seed)
    upstream = torch.randn(13, dtype=torch.float64, generator=torch.Generator().manual_seed(9))

    mine = logits.clone().requires_grad_(True)
    logprob, entropy = _TokenLogprobEntropy.apply(mine, targets, temperature, False)
    (logprob * upstream).sum().backward()

    theirs = logits.clone().requires_grad_(True)
    expected_logprob, expected_entropy = _reference(theirs, targets, temperature)
    (expected_logprob * upstream).sum().backward()

    assert torch.allclose(logprob, expected_logprob, rtol=0, atol=1e-12)
    assert torch.allclose(entropy, expected_entropy.detach(), rtol=0, atol=1e-10)
    assert mine.grad is not None and theirs.grad is not None
    assert torch.allclose(mine.grad, theirs.grad, rtol=0, atol=1e-12)


def test_second_backward_is_refused_not_wrong() -> None:
    """The backward pass writes the gradient into the buffer it saved: a graph retained and
    differentiated again must fail loudly (autograd's version check), never reuse it."""
    logits, targets, temperature = _case(4, 11, 2.0, 3)
    logits.requires_grad_(True)
    logprob, _ = _TokenLogprobEntropy.apply(logits, targets, temperature, False)
    logprob.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        logprob.sum().backward()


def test_float32_entry_point_and_entropy_carries_no_gradient() -> None:
    logits, targets, temperature = _case(8, 49152, 4.0, 5)  # a real model's vocabulary width
    half = logits.to(torch.bfloat16).requires_grad_(True)
    logprob, entropy = token_logprob_entropy(half, targets, temperature)
    assert logprob.dtype == entropy.dtype == torch.float32
    assert not entropy.requires_grad
    expected, expected_entropy = _reference(half.detach().double(), targets, temperature)
    assert torch.allclose(logprob.double(), expected, atol=1e-4)
    assert torch.allclose(entropy.double(), expected_entropy, atol=1e-4)
    logprob.sum().backward()
    assert half.grad is not None and half.grad.dtype == torch.bfloat16
    exact = half.detach().double().requires_grad_(True)
    _reference(exact, targets, temperature)[0].sum().backward()
    assert exact.grad is not None
    error = (half.grad.double() - exact.grad).abs().max()
    assert error <= 2**-7 * exact.grad.abs().max()  # bf16 keeps 8 significant bits


@pytest.mark.parametrize(("scale", "seed", "only_entropy"), [(1.0, 0, False), (30.0, 1, False),
                                                             (3.0, 2, True)])  # fmt: skip
def test_entropy_gradient_equals_autograd_of_the_plain_entropy(
    scale: float, seed: int, only_entropy: bool
) -> None:
    """With `entropy_grad` the entropy is differentiable too (the loss's entropy term): the
    logits' gradient from both outputs at once equals autograd's through log_softmax, in
    float64, and so it does with the entropy alone."""
    logits, targets, temperature = _case(13, 257, scale, seed)
    generator = torch.Generator().manual_seed(11)
    upstream = torch.randn(13, dtype=torch.float64, generator=generator)
    upstream_entropy = torch.randn(13, dtype=torch.float64, generator=generator)
    if only_entropy:
        upstream = torch.zeros_like(upstream)

    mine = logits.clone().requires_grad_(True)
    logprob, entropy = _TokenLogprobEntropy.apply(mine, targets, temperature, True)
    assert entropy.requires_grad
    ((logprob * upstream).sum() + (entropy * upstream_entropy).sum()).backward()

    theirs = logits.clone().requires_grad_(True)
    expected_logprob, expected_entropy = _reference(theirs, targets, temperature)
    ((expected_logprob * upstream).sum() + (expected_entropy * upstream_entropy).sum()).backward()

    assert torch.allclose(entropy, expected_entropy.detach(), rtol=0, atol=1e-10)
    assert mine.grad is not None and theirs.grad is not None
    assert torch.allclose(mine.grad, theirs.grad, rtol=0, atol=1e-10)


def test_entropy_with_its_gradient_through_the_float32_entry_point() -> None:
    logits, targets, temperature = _case(6, 1000, 4.0, 7)
    mine = logits.float().requires_grad_(True)
    _, entropy = token_logprob_entropy(mine, targets, temperature, entropy_grad=True)
    entropy.sum().backward()
    exact = logits.clone().requires_grad_(True)
    _reference(exact, targets, temperature)[1].sum().backward()
    assert mine.grad is not None and exact.grad is not None
    assert torch.allclose(mine.grad.double(), exact.grad, atol=1e-5)
