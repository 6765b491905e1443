"""The LM head of a CPU decode pass in blocks of vocabulary columns.

A decode pass multiplies a few dozen rows by the whole output embedding (49,152 × 576 for
SmolLM2, 262,144 × 640 for Gemma 3). Done as one product, the head ran at 48–60 GFLOP/s on one
Zen 4 core against the 84–94 of the model's other linears: the [rows, vocab] result of a large
vocabulary leaves the core's caches while the weights stream past. In blocks of 1,024 columns
each block's result stays in cache while its rows of the weight are read once. The same
products, each output element still one dot product over the hidden size (the logits were
bit-identical on the Zen 4 measured; a BLAS may pick another kernel for a narrower product
elsewhere, within float rounding), and a whole fp32 decode pass on one core is 1.01–1.03×
faster for SmolLM2 and 1.13–1.18× for Gemma 3, whose head is half its pass
(benchmarks/RESULTS.md 2026-11-28 (afternoon); its script retired, at `a66e0fb`).

Only where it measured better and cannot change autograd: on a CPU, for an `nn.Linear` head
without bias, and only while gradients are off (the engine's passes); anything else runs the
head's own forward.
"""

from __future__ import annotations

import types

import torch

COLUMNS_PER_BLOCK = 1024


def blocked_linear(hidden: torch.Tensor, weight: torch.Tensor, columns: int) -> torch.Tensor:
    """hidden [..., in] @ weight[out, in]ᵀ -> [..., out], computed `columns` outputs at a time
    into one preallocated result."""
    rows = hidden.reshape(-1, hidden.shape[-1])
    out = torch.empty(rows.shape[0], weight.shape[0], dtype=hidden.dtype, device=hidden.device)
    for start in range(0, weight.shape[0], columns):
        stop = min(start + columns, weight.shape[0])
        torch.mm(rows, weight[start:stop].t(), out=out[:, start:stop])
    return out.view(*hidden.shape[:-1], weight.shape[0])


def use_blocked_head(model: torch.nn.Module, columns: int = COLUMNS_PER_BLOCK) -> bool:
    """Make `model`'s output embedding compute in blocks while gradients are off; returns
    whether it does. Parameters, names and tied weights stay as they were (the head's own
    `weight` is read on every call, so installed weights are used at once)."""
    head = model.get_output_embeddings()
    device = next(model.parameters()).device
    if not isinstance(head, torch.nn.Linear) or head.bias is not None or device.type != "cpu":
        return False
    whole = head.forward

    def forward(self: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or hidden.dtype != self.weight.dtype:
            return whole(hidden)
        return blocked_linear(hidden, self.weight, columns)

    head.forward = types.MethodType(forward, head)  # type: ignore[method-assign]
    return True
