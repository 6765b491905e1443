"""A CPU decode pass's linear weights kept input-major: each `[out, in]` weight stored as the
transpose of an `[in, out]` block.

`nn.Linear` computes `x @ Wᵀ`. With `W` stored `[out, in]` row by row, the BLAS multiplies a few
dozen rows by a transposed operand; stored the other way round the same product reads the
weight straight. On one float32 core of an Intel Xeon (family 6 model 207) SmolLM2's thirty
layers of linears took 99 → 79 ms at 32 rows and 111 → 90 ms at 40, and 1.0× at a trainer's
256–800 rows; the engine's whole decode 1.12× faster at 32 rows and 1.13× at 40 and 64
(benchmarks/RESULTS.md, 2026-12-06 (evening); its script retired, at `4815446`). In bfloat16 it
measured no better, so only float32 weights change. The outputs are the same products:
bit-identical at 32 rows and more on the machine measured, within float rounding at a handful
of rows, where the BLAS may pick another kernel. Not measured on AMD's CPUs.

Nothing else changes: the parameter keeps its shape, name and object (`.data` is replaced), so
loading weights (`copy_`), merging LoRA (`addmm(..., out=)` writes through the layout) and the
fingerprint (the values in row order, whatever their layout) behave as before. Weights that
replace a parameter's storage wholesale are staged in its layout first (`like_parameter`).
The output embedding is left as it is: it is tied to the input embedding in most small models,
and `blocked_head.py` computes it."""

from __future__ import annotations

import torch


def is_input_major(weight: torch.Tensor) -> bool:
    """A 2-D weight whose transpose is contiguous (and which is not contiguous itself)."""
    return weight.dim() == 2 and not weight.is_contiguous() and weight.t().is_contiguous()


def lay_out_input_major(model: torch.nn.Module) -> int:
    """Store every float32 CPU `nn.Linear` weight of `model` but its output embedding
    input-major; returns how many changed. Only for a model the engine owns: a trainer's model
    handed to an engine keeps its own layout."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    changed = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear) or module is head:
                continue
            weight = module.weight
            if weight.device.type != "cpu" or weight.dtype != torch.float32:
                continue
            if head is not None and weight is head.weight:  # tied to the head elsewhere
                continue
            if not weight.is_contiguous():
                continue  # already laid out (or shared storage someone else owns)
            weight.data = weight.detach().t().contiguous().t()
            changed += 1
    return changed


def like_parameter(tensor: torch.Tensor, parameter: torch.Tensor) -> torch.Tensor:
    """`tensor` staged to become `parameter`'s storage: in its dtype and, for an input-major
    weight, in its layout (on its device, the CPU); any other stays where it is."""
    if not is_input_major(parameter):
        return tensor.to(parameter.dtype)
    staged = torch.empty_like(parameter)  # keeps the parameter's strides
    staged.copy_(tensor)
    return staged
