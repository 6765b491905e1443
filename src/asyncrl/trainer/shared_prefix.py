"""Shared-prefix packing: a group's prompt once, then each of its completions.

GRPO trains G completions of one prompt; packed one sample at a time, the prompt goes through
the model G times per step for identical activations. Here the samples of a batch that share
their prompt token ids form a unit laid out as `prompt, completion_1, …, completion_G`, with

- positions continuing from the prompt for every completion (each starts at len(prompt));
- an attention mask in which a prompt token sees the prompt causally and a completion token
  sees the prompt and its own completion causally, never a sibling: the same attention each
  token had in its own sample, so logprobs and gradients are those of unshared packing;
- a predictor per token (whose hidden state predicts it): the token before it, except the
  first token of a completion, predicted by the prompt's last token.

A unit costs len(prompt) + Σ len(completion) tokens. A group longer than `sequence_len` is
either split into several units of the same prompt (each repeats the prompt) or kept whole in
a row up to twice as wide, whichever lays the batch out in fewer positions (`group_rows`).
The mask is a dense `[rows, 1, L, L]` boolean for SDPA (and eager): fine at these lengths on
CPU, O(L²) memory per row on long GPU rows, where a
FlexAttention block mask would be the better path (not built; the trainer says so on GPUs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from asyncrl.trainer.packing import PackedBatch, Sample, first_fit_decreasing, row_width

PREFIX_BRANCH = 0
WIDEST_ROW = 2  # a group kept whole widens a row to at most this many times `sequence_len`
WIDTH_MULTIPLE = 16  # a micro-batch's rows are as wide as its longest, rounded up to this


def prompt_units(
    prompts: Sequence[Sequence[int]], lengths: Sequence[int], chosen: Sequence[int], capacity: int
) -> list[list[int]]:
    """The `chosen` samples grouped by identical prompt (in order of first appearance), each
    group cut into units of at most `capacity` tokens (prompt once plus the completions)."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for index in chosen:
        by_prompt.setdefault(tuple(prompts[index]), []).append(index)
    units = []
    for prompt, members in by_prompt.items():
        unit: list[int] = []
        cost = len(prompt)
        for member in members:
            completion = lengths[member] - len(prompt)
            if unit and cost + completion > capacity:
                units.append(unit)
                unit, cost = [], len(prompt)
            unit.append(member)
            cost += completion
        units.append(unit)
    return units


def unit_length(unit: Sequence[int], prompt_length: int, lengths: Sequence[int]) -> int:
    return prompt_length + sum(lengths[member] - prompt_length for member in unit)


@dataclass(frozen=True)
class GroupRows:
    rows: list[list[list[int]]]  # rows of units of sample indices
    capacity: int  # the widest a row may be
    rows_per_pass: int  # rows in one micro-batch
    positions: int  # Σ over micro-batches of rows × width: what the decoder computes


def group_rows(
    prompts: Sequence[Sequence[int]],
    lengths: Sequence[int],
    chosen: Sequence[int],
    sequence_len: int,
    rows_per_micro_batch: int,
    min_micro_batches: int = 1,
) -> GroupRows:
    """Rows of shared-prefix units, packed first-fit decreasing, in the layout with fewer
    positions: units of at most `sequence_len` tokens, or every group whole in rows as wide as
    the longest group, where that is at most `WIDEST_ROW` × `sequence_len`.

    Split, a group of G answers longer than a row repeats its prompt in every piece, and the
    pieces leave rows part empty: the quick start's groups of 8 × 32 tokens behind a 65-token
    prompt came to 8 rows × 256 positions for 1,263 tokens; whole, to 4 rows × 328. A pass holds
    at most `rows_per_micro_batch` × `sequence_len` positions either way (fewer, wider rows), so
    its activation memory is bounded as before; attention spans the wider row (masked per
    sample, as in a split one), which the fewer positions pay for up to that width."""
    whole = max(
        (
            unit_length(unit, len(prompts[unit[0]]), lengths)
            for unit in prompt_units(prompts, lengths, chosen, capacity=2**62)
        ),
        default=0,
    )
    capacities = [sequence_len]
    if sequence_len < whole <= WIDEST_ROW * sequence_len:
        capacities.append(-(-whole // WIDTH_MULTIPLE) * WIDTH_MULTIPLE)
    layouts = [
        _packed(prompts, lengths, chosen, capacity, rows_per_micro_batch * sequence_len,
                rows_per_micro_batch, min_micro_batches)
        for capacity in capacities
    ]  # fmt: skip
    return min(layouts, key=lambda layout: layout.positions)  # a tie keeps the narrower


def _packed(
    prompts: Sequence[Sequence[int]],
    lengths: Sequence[int],
    chosen: Sequence[int],
    capacity: int,
    positions_per_pass: int,
    rows_per_micro_batch: int,
    min_micro_batches: int,
) -> GroupRows:
    units = prompt_units(prompts, lengths, chosen, capacity)
    costs = [unit_length(unit, len(prompts[unit[0]]), lengths) for unit in units]
    bins = first_fit_decreasing(costs, capacity)
    rows = [[units[i] for i in members] for members in bins]
    row_costs = [sum(costs[i] for i in members) for members in bins]
    widest_pass = max(1, min(rows_per_micro_batch, positions_per_pass // capacity))
    size = min(widest_pass, max(1, -(-len(rows) // min_micro_batches)))
    positions = 0
    for start in range(0, len(rows), size):
        longest = max(row_costs[start : start + size])
        width = min(capacity, -(-longest // WIDTH_MULTIPLE) * WIDTH_MULTIPLE)
        positions += len(row_costs[start : start + size]) * width
    return GroupRows(rows, capacity, size, positions)


def collate_shared_rows(
    rows: Sequence[Sequence[Sequence[int]]],
    samples: Sequence[Sample],
    prompt_lengths: Sequence[int],
    seq_len: int,
    pad_token_id: int,
) -> tuple[PackedBatch, dict[int, tuple[int, int, int]]]:
    """Rows of units laid out as prompt + completions, padded to the longest row's width; and
    each member's completion span `(row, start, end)` in the packed rows."""
    longest = max(
        (
            sum(prompt_lengths[unit[0]] + sum(
                len(samples[m].input_ids) - prompt_lengths[unit[0]] for m in unit
            ) for unit in units)
            for units in rows
        ),
        default=1,
    )  # fmt: skip
    width = row_width(longest, seq_len)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_token_id, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.bool)
    sample_index = torch.full(shape, -1, dtype=torch.long)
    predictor = torch.arange(width).sub(1).clamp(min=0).repeat(len(rows), 1)
    unit_id = torch.full(shape, -1, dtype=torch.long)  # padding: its own unit per row
    branch = torch.zeros(shape, dtype=torch.long)
    spans: dict[int, tuple[int, int, int]] = {}
    for row, units in enumerate(rows):
        offset = 0
        for number, unit in enumerate(units):
            prompt_length = prompt_lengths[unit[0]]
            prompt = samples[unit[0]].input_ids[:prompt_length]
            end = offset + prompt_length
            _check_room(end, seq_len, row)
            input_ids[row, offset:end] = torch.tensor(prompt)
            position_ids[row, offset:end] = torch.arange(prompt_length)
            sample_index[row, offset:end] = unit[0]  # the prompt is its first member's
            unit_id[row, offset:end] = number
            last_prompt_token = end - 1
            offset = end
            for completion_number, member in enumerate(unit, start=1):
                sample = samples[member]
                completion = sample.input_ids[prompt_length:]
                end = offset + len(completion)
                _check_room(end, seq_len, row)
                input_ids[row, offset:end] = torch.tensor(completion, dtype=torch.long)
                position_ids[row, offset:end] = torch.arange(
                    prompt_length, prompt_length + end - offset
                )
                loss_mask[row, offset:end] = torch.tensor(sample.loss_mask[prompt_length:])
                sample_index[row, offset:end] = member
                unit_id[row, offset:end] = number
                branch[row, offset:end] = completion_number
                if end > offset:
                    predictor[row, offset] = last_prompt_token
                spans[member] = (row, offset, end)
                offset = end
        position_ids[row, offset:] = torch.arange(width - offset)
    return PackedBatch(
        input_ids, position_ids, loss_mask, sample_index,
        attention_mask=shared_attention_mask(unit_id, branch), predictor=predictor,
    ), spans  # fmt: skip


def shared_attention_mask(unit_id: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """`[rows, 1, L, L]`, True where query q may attend to key k: k ≤ q in the same unit, and k
    in the prompt or in q's own completion."""
    length = unit_id.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    same_unit = unit_id[:, :, None] == unit_id[:, None, :]
    visible_branch = (branch[:, None, :] == PREFIX_BRANCH) | (
        branch[:, :, None] == branch[:, None, :]
    )
    return (causal & same_unit & visible_branch).unsqueeze(1)


def _check_room(end: int, seq_len: int, row: int) -> None:
    if end > seq_len:
        raise ValueError(f"row {row} holds {end} tokens, more than seq_len {seq_len}")
