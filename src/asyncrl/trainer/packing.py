"""Padding-free packing of variable-length samples into fixed-length rows.

Samples are placed first-fit-decreasing into rows of at most `seq_len` tokens; a micro-batch's
rows are as wide as its longest (`row_width`). Position ids restart at
0 for every sample, which is how the model sees sample boundaries: with no attention mask,
transformers builds a block-diagonal causal mask from restarting position ids (SDPA and eager
on CPU), and flash-attention's varlen path does the same on GPU. The unused tail of a row is
padding with its own restarting positions and no loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class Sample:
    input_ids: list[int]  # prompt + completion
    loss_mask: list[bool]  # True where the token is a training target

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(
                f"sample has {len(self.input_ids)} tokens but {len(self.loss_mask)} mask entries"
            )


@dataclass(frozen=True)
class PackedBatch:
    """A micro-batch of packed rows."""

    input_ids: torch.Tensor  # [rows, seq_len] long
    position_ids: torch.Tensor  # [rows, seq_len] long, restarting at 0 per sample
    loss_mask: torch.Tensor  # [rows, seq_len] bool: token is a training target
    sample_index: torch.Tensor  # [rows, seq_len] long: index into the samples, -1 = padding
    # shared-prefix layout (`shared_prefix.py`); None: one sample after another, as above
    attention_mask: torch.Tensor | None = None  # [rows, 1, seq_len, seq_len] bool
    predictor: torch.Tensor | None = None  # [rows, seq_len] long: whose hidden state predicts

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def to(self, device: torch.device) -> PackedBatch:
        moved = (None if t is None else t.to(device) for t in astuple_shallow(self))
        return PackedBatch(*moved)  # type: ignore[arg-type]


def astuple_shallow(instance: object) -> tuple[torch.Tensor, ...]:
    """A dataclass's fields in order, without the deep copy `dataclasses.astuple` makes."""
    return tuple(getattr(instance, f.name) for f in fields(instance))  # type: ignore[arg-type]


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of item indices, each bin's total length <= capacity; longest items placed first."""
    too_long = [index for index, length in enumerate(lengths) if length > capacity]
    if too_long:
        raise ValueError(
            f"{len(too_long)} sample(s) longer than seq_len {capacity} "
            f"(first: index {too_long[0]}, {lengths[too_long[0]]} tokens)"
        )
    bins: list[list[int]] = []
    free: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for bin_index, room in enumerate(free):
            if lengths[index] <= room:
                bins[bin_index].append(index)
                free[bin_index] -= lengths[index]
                break
        else:
            bins.append([index])
            free.append(capacity - lengths[index])
    return bins


ROW_MULTIPLE = 8  # row widths are rounded up to this, so kernels meet few distinct shapes


def row_width(longest: int, seq_len: int) -> int:
    """How wide a micro-batch's rows are: the longest row, rounded up to ROW_MULTIPLE, at most
    `seq_len`. Padding every row to `seq_len` made a short batch's step compute 30 % padding
    (and attention over it quadratically)."""
    return min(seq_len, -(-longest // ROW_MULTIPLE) * ROW_MULTIPLE)


def collate_rows(
    rows: Sequence[Sequence[int]], samples: Sequence[Sample], seq_len: int, pad_token_id: int
) -> PackedBatch:
    """Lay out each row's samples end to end and pad the tail (to the longest row's width)."""
    longest = max((sum(len(samples[m].input_ids) for m in members) for members in rows), default=1)
    width = row_width(longest, seq_len)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_token_id, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.bool)
    sample_index = torch.full(shape, -1, dtype=torch.long)
    for row, members in enumerate(rows):
        offset = 0
        for member in members:
            sample = samples[member]
            end = offset + len(sample.input_ids)
            if end > seq_len:
                raise ValueError(f"row {row} holds {end} tokens, more than seq_len {seq_len}")
            input_ids[row, offset:end] = torch.tensor(sample.input_ids)
            position_ids[row, offset:end] = torch.arange(end - offset)
            loss_mask[row, offset:end] = torch.tensor(sample.loss_mask)
            sample_index[row, offset:end] = member
            offset = end
        position_ids[row, offset:] = torch.arange(width - offset)
    return PackedBatch(input_ids, position_ids, loss_mask, sample_index)
