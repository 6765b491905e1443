"""The engine's linear layers in int8 (`inference.quantization: int8`): each weight held in int8
with one scale per output channel, each row of activations quantized to int8 on the fly with a
scale of its own, and the product of the two computed exactly in int32 by torch's own CPU kernel
`torch._int_mm` (dynamic per-token W8A8, the scheme of torchao's
`Int8DynamicActivationInt8WeightConfig`).

Why this scheme: a decode pass is a few dozen rows through every weight, and 78 % of it is the
BLAS's float products at those rows (benchmarks/RESULTS.md, 2026-12-06). Of the int8 kernels
torch 2.13 ships for a CPU, measured one thread at SmolLM2's shapes and 8-64 rows on a Zen 4
(docs/inference.md has the table): this one ran 2.5-3x float32's rate and 1.1-1.3x oneDNN's
prepacked bfloat16; fbgemm's dynamic int8 linear ran faster still, but quantizes the
activations of a whole pass with one scale, and on the real model that moved the next-token
distribution by a KL of 0.63 (this scheme: 0.036); weight-only int8 (`_weight_int8pack_mm`)
moved it least (0.003) but ran at float32's rate with bfloat16 activations and ~100x slower
with float32 ones.

The error, exactly: the sums are exact integers, so an output differs from the float product
only by the two roundings: a weight moves by at most half its row's step `s_w[n] / 2`, an input
by at most half its row's step `s_x[m] / 2`, and `y[m, n]` by at most
`s_x[m] / 2 · Σ_k |w[n, k]| + s_w[n] / 2 · Σ_k |x̂[m, k]|` (x̂ the rounded inputs), plus float
rounding of the two scalings. A row's result does not depend on the other rows of its pass
(its scale is its own, the sums exact): batched or alone, the same tokens. The engine samples
from this model and returns the logprobs of what it sampled; the trainer scores them in its own
precision and its importance-sampling correction handles the difference (`trainer/mismatch_kl`).

The float weights stay the parameters: loads (`install`), LoRA merges (`apply_lora`) and the
fingerprint read and write them as before, and every such write ends with `requantize`, which
quantizes the new float values (never an int8 weight again). The int8 copy is held beside them
(a quarter of their size in float32) and is what a pass reads. Only while gradients are off
(the engine's passes): anything else runs the layer's own float forward.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from dataclasses import dataclass

import torch

LEVELS = 127  # symmetric: q in [-127, 127], so -q is representable and zero is exact
SMALLEST = torch.finfo(torch.float32).tiny
# the LM head on int8 too: at 8-64 rows its product ran 2.2-3.4x float32's blocked head and
# 1.2-2.0x oneDNN's prepacked bfloat16 (the probe in docs/inference.md)
QUANTIZE_HEAD = True
# a wide product (an LM head) runs in blocks of columns, each block's int32 result scaled while
# it is in cache, as `blocked_head.py` does for a float head
COLUMNS_PER_BLOCK = 1024


@dataclass
class Int8Weight:
    """A linear layer's weight as the engine multiplies it."""

    values: torch.Tensor  # [out, in] int8, contiguous
    scales: torch.Tensor  # [out] float32: row n of the weight is values[n] · scales[n]


def quantize_per_output_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([out, in] int8, [out] float32 scales) of a float `[out, in]` weight: each row scaled by
    its largest magnitude over 127 and rounded to nearest (a row of zeros keeps scale 1)."""
    rows = weight.detach().float()
    largest = rows.abs().amax(dim=1)
    scales = torch.where(largest > 0, largest / LEVELS, torch.ones_like(largest))
    values = torch.round(rows / scales[:, None]).clamp_(-LEVELS, LEVELS).to(torch.int8)
    return values.contiguous(), scales


def int8_linear(
    hidden: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """hidden [..., in] @ (values · scales)ᵀ [+ bias] -> [..., out], in `hidden`'s dtype, each
    row of `hidden` quantized with its own scale and the products summed exactly in int32."""
    rows = hidden.reshape(-1, hidden.shape[-1]).float()  # no copy in a float32 engine
    # as the weights' rows, in fewer passes: a row's largest magnitude maps to ±127, so the
    # rounded quotients need no clamp, and a row of zeros stays zeros whatever its scale
    row_scales = rows.abs().amax(dim=1, keepdim=True).clamp_(min=SMALLEST).div_(LEVELS)  # [m, 1]
    quantized = torch.round(rows / row_scales).to(torch.int8)  # [m, in]
    outputs = weight.values.shape[0]
    if outputs <= COLUMNS_PER_BLOCK:
        out = (torch._int_mm(quantized, weight.values.t()) * row_scales).mul_(weight.scales)
    else:
        out = torch.empty(rows.shape[0], outputs, dtype=torch.float32, device=rows.device)
        for start in range(0, outputs, COLUMNS_PER_BLOCK):
            stop = min(start + COLUMNS_PER_BLOCK, outputs)
            block = torch._int_mm(quantized, weight.values[start:stop].t())
            torch.mul(block, row_scales, out=out[:, start:stop])
            out[:, start:stop].mul_(weight.scales[start:stop])
    out = out.to(hidden.dtype)
    if bias is not None:
        out += bias
    return out.view(*hidden.shape[:-1], outputs)


def _int8_of(module: torch.nn.Module) -> Int8Weight | None:
    return getattr(module, "int8_weight", None)


def _quantize_into(module: torch.nn.Linear) -> None:
    module.int8_weight = Int8Weight(*quantize_per_output_channel(module.weight))


def use_int8_linears(model: torch.nn.Module, head: bool) -> int:
    """Quantize every CPU `nn.Linear` of `model` (its output embedding too where `head`) and
    make each compute from its int8 copy while gradients are off; returns how many. Parameters,
    names and tied weights stay as they are."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    count = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or (module is output and not head):
            continue
        if module.weight.device.type != "cpu" or _int8_of(module) is not None:
            continue
        _quantize_into(module)
        whole = module.forward

        def forward(
            self: torch.nn.Linear, hidden: torch.Tensor, whole=whole
        ) -> torch.Tensor:  # fmt: skip
            quantized = _int8_of(self)
            if torch.is_grad_enabled() or quantized is None or hidden.dtype != self.weight.dtype:
                return whole(hidden)
            return int8_linear(hidden, quantized, self.bias)

        module.forward = types.MethodType(forward, module)  # type: ignore[method-assign]
        count += 1
    return count


def is_int8(module: torch.nn.Module) -> bool:
    """Whether `module` computes from an int8 copy of its weight (`use_int8_linears`)."""
    return _int8_of(module) is not None


def requantize(model: torch.nn.Module, changed: Iterable[torch.Tensor] | None = None) -> int:
    """Quantize again, from their float values, the int8 layers whose weight is one of `changed`
    (parameters, by identity; None: all of them); returns how many. Call after any write to the
    weights (on the engine's thread, between passes); a model without int8 layers: nothing."""
    wanted = None if changed is None else {id(tensor) for tensor in changed}
    count = 0
    with torch.no_grad():
        for module in model.modules():
            if _int8_of(module) is None:
                continue
            if wanted is not None and id(module.weight) not in wanted:
                continue
            _quantize_into(module)  # type: ignore[arg-type]
            count += 1
    return count
