"""Log p(token) and entropy from a chunk of logits in few passes over its `[tokens × vocab]`.

The trainer needs, per loss token, the log-probability of the sampled token and the entropy of
the distribution it was sampled from, both at the sampling temperature. Written as plain torch
(`logits / T`, `logsumexp`, `gather`, `softmax`, `(p · z).sum`) autograd runs ~20 vocabulary-wide
elementwise passes forward and backward, most with a `[tokens × vocab]` temporary (50 MB at 256
tokens of a 49k vocabulary); on one CPU core ~6 % of the quick start's LoRA step
(benchmarks/RESULTS.md, 2026-12-02 (evening), Intel). Here:

forward  m = max_v z (as z/T's max is m/T for T > 0), s = (z − m)/T in one `addcmul`,
         e = exp(s), S = Σ e, log p = s[target] − log S, H = log S − (Σ e·s)/S (a dot, no
         temporary);
backward ∂log p/∂z_v = (1[v = target] − e_v/S)/T, written into `e` in place: one pass.

Besides the logits, `s` and `e` are the only `[tokens × vocab]` tensors, and `e` becomes the
gradient. The entropy is a statistic and gets no gradient (as the composite path had it,
`no_grad`), unless the loss has an entropy term (`loss.entropy_coef`): then `s` is kept too and
the backward pass adds ∂H/∂z_v = −p_v · (log p_v + H)/T, with log p_v = s_v − log S, in the same
pass. The backward pass consumes what it saved, so a graph is differentiated once (the trainer
never retains one); a second backward fails autograd's version check rather than reuse the
buffer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable


class _TokenLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        temperature: torch.Tensor,
        entropy_grad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inverse = temperature.reciprocal().unsqueeze(-1)  # [T, 1]
        maxes = logits.amax(dim=-1, keepdim=True)
        shifted = torch.addcmul(-maxes * inverse, logits, inverse)  # (z − m)/T, all ≤ 0
        exps = shifted.exp()
        sums = exps.sum(dim=-1)
        log_sums = sums.log()
        picked = shifted.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        expected_shifted = torch.linalg.vecdot(exps, shifted) / sums
        entropy = log_sums - expected_shifted
        ctx.entropy_grad = entropy_grad
        if entropy_grad:
            ctx.save_for_backward(exps, sums, targets, inverse, shifted, log_sums, entropy)
        else:
            ctx.save_for_backward(exps, sums, targets, inverse)
            ctx.mark_non_differentiable(entropy)
        return picked - log_sums, entropy

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx: Any, grad_logprob: torch.Tensor, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, None, None, None]:
        saved = ctx.saved_tensors  # unpacked once: checkpointing allows no second unpack
        exps, sums, targets, inverse = saved[:4]
        scale = grad_logprob.unsqueeze(-1) * inverse  # [T, 1]: g/T
        if ctx.entropy_grad and grad_entropy is not None:
            shifted, log_sums, entropy = saved[4:]
            entropy_scale = (grad_entropy * inverse.squeeze(-1)).unsqueeze(-1)  # [T, 1]: h/T
            # −p_v · (g + h·(log p_v + H))/T, with log p_v + H = s_v − log S + H
            offset = (entropy - log_sums).unsqueeze(-1)  # [T, 1]
            factor = shifted.add_(offset).mul_(entropy_scale).add_(scale)  # in s's buffer
            grad = exps.mul_(factor).div_(-sums.unsqueeze(-1))
        else:
            grad = exps.mul_(-scale / sums.unsqueeze(-1))  # −g·p_v/T, in the saved buffer
        grad.scatter_add_(-1, targets.unsqueeze(-1), scale)  # + g/T at the target
        return grad, None, None, None


def token_logprob_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(targets), entropy), each `[T]` float32, of `logits` `[T, vocab]` at per-token
    `temperature` `[T]` (> 0). Differentiable in `logits` through the log-probability, and
    through the entropy too with `entropy_grad` (one more `[T × vocab]` buffer kept)."""
    logits = logits.float()
    return _TokenLogprobEntropy.apply(logits, targets, temperature.to(logits.dtype), entropy_grad)
