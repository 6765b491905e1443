"""From a TrainingBatch to packed micro-batches with every per-token tensor the loss needs.

Loss tokens are the completion tokens whose `completion_mask` is true. All flat `[T]` tensors
follow the row-major order in which `completion_logprobs` returns them. Normalisation weights
come from totals over the whole batch, so micro-batches add up to the step's loss exactly; which
weights, the loss's normalisation decides (`normalisation.py`): this module only counts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from asyncrl.config.trainer import LossConfig
from asyncrl.trainer.normalisation import Normalisation, StepTotals, normalisation_named
from asyncrl.trainer.packing import (
    PackedBatch,
    Sample,
    astuple_shallow,
    collate_rows,
    first_fit_decreasing,
)
from asyncrl.trainer.shared_prefix import (
    WIDTH_MULTIPLE,
    collate_shared_rows,
    group_rows,
    prompt_units,
)
from asyncrl.types import TrainingBatch, TrainingSample


@dataclass(frozen=True)
class MicroBatch:
    packed: PackedBatch
    temperature: torch.Tensor  # [rows, seq_len] each token's sampling temperature
    inference_logprobs: torch.Tensor  # [T]
    advantages: torch.Tensor  # [T]
    policy_versions: torch.Tensor  # [T]
    sequence_ids: torch.Tensor  # [T] 0..S-1 within this micro-batch
    token_weights: torch.Tensor  # [T] step-level normalisation

    @property
    def num_loss_tokens(self) -> int:
        return int(self.advantages.numel())

    def to(self, device: torch.device) -> MicroBatch:
        packed, *tensors = astuple_shallow(self)
        return MicroBatch(packed.to(device), *(tensor.to(device) for tensor in tensors))


def _as_sample(sample: TrainingSample) -> Sample:
    return Sample(
        input_ids=[*sample.prompt_ids, *sample.completion_ids],
        loss_mask=[False] * len(sample.prompt_ids) + list(sample.completion_mask),
    )


def build_micro_batches(
    batch: TrainingBatch,
    sequence_len: int,
    rows_per_micro_batch: int,
    pad_token_id: int,
    normalisation: Normalisation | str,
    packing: bool = True,
    only: list[int] | None = None,
    min_micro_batches: int = 1,
    shared_prefix: bool = False,
    loss_config: LossConfig | None = None,
) -> list[MicroBatch]:
    """Micro-batches of the samples `only` names (this rank's share; all when None), each
    token weighted by totals over the *whole* batch, so that the ranks' losses add up to the
    loss one process would compute on the whole batch. The rows are spread over at least
    `min_micro_batches` passes (gradient accumulation), fewer rows per pass if need be.
    `normalisation`: the loss's (`loss_named(...).normalisation`), given `loss_config` (the
    keys it reads; None = the defaults), or one named "token", "sequence" or "constant" (L =
    the longest completion). `shared_prefix`: samples with the same prompt share it in their
    row (`shared_prefix.py`)."""
    samples = [_as_sample(s) for s in batch.samples]
    lengths = [len(s.input_ids) for s in samples]
    too_long = [i for i, n in enumerate(lengths) if n > sequence_len]
    if too_long:
        raise ValueError(
            f"batch {batch.step}: sample {too_long[0]} has {lengths[too_long[0]]} tokens, more "
            f"than sequence_len {sequence_len} (orchestrator seq_len must not exceed it)"
        )
    loss_counts = [sum(s.completion_mask) for s in batch.samples]
    trained = [n for n in loss_counts if n > 0]
    totals = StepTotals(
        tokens=sum(trained),
        sequences=len(trained),
        longest=max(trained, default=1),
        max_tokens=batch.max_tokens,
    )
    if isinstance(normalisation, str):
        normalisation = normalisation_named(normalisation)
    # [S] loss tokens -> [S] weight of each sequence's tokens, the same for every micro-batch
    weigh = functools.partial(normalisation, totals=totals, config=loss_config or LossConfig())
    chosen = list(range(len(samples))) if only is None else list(only)
    prompt_lengths = [len(s.prompt_ids) for s in batch.samples]
    capacity = sequence_len  # the widest a row may be
    if shared_prefix and packing:  # rows of units: a prompt once, then its completions
        grouped = group_rows([s.prompt_ids for s in batch.samples], lengths, chosen,
                             sequence_len, rows_per_micro_batch, min_micro_batches)  # fmt: skip
        rows, capacity, size = grouped.rows, grouped.capacity, grouped.rows_per_pass
    else:
        if shared_prefix:  # one unit per row, padded to sequence_len
            units = prompt_units([s.prompt_ids for s in batch.samples], lengths, chosen,
                                 sequence_len)  # fmt: skip
            rows = [[unit] for unit in units]
        else:  # rows of units of one sample each
            units, costs = [[index] for index in chosen], [lengths[index] for index in chosen]
            if packing:
                rows = [[units[i] for i in row] for row in first_fit_decreasing(costs, capacity)]
            else:  # one sample per row
                rows = [[unit] for unit in units]
        size = min(rows_per_micro_batch, max(1, math.ceil(len(rows) / min_micro_batches)))
    layout = Layout(samples, prompt_lengths, capacity, pad_token_id, shared_prefix)
    return [
        _micro_batch(rows[start : start + size], layout, batch, loss_counts, weigh)
        for start in range(0, len(rows), size)
    ]


@dataclass(frozen=True)
class Layout:
    samples: list[Sample]
    prompt_lengths: list[int]
    capacity: int  # the widest a row may be: `sequence_len`, or a whole group's length
    pad_token_id: int
    shared_prefix: bool

    def unit_length(self, unit: list[int]) -> int:
        if not self.shared_prefix:
            return sum(len(self.samples[member].input_ids) for member in unit)
        prompt = self.prompt_lengths[unit[0]]
        return prompt + sum(len(self.samples[member].input_ids) - prompt for member in unit)

    def width(self, rows: list[list[list[int]]]) -> int:
        """A micro-batch's rows are as wide as its longest, not `capacity`: padding costs
        as much compute as tokens do (a third of the quick start's trainer step was padding),
        and attention's cost grows with the square of the width."""
        longest = max(sum(self.unit_length(unit) for unit in row) for row in rows)
        return min(self.capacity, -(-longest // WIDTH_MULTIPLE) * WIDTH_MULTIPLE)

    def collate(
        self, rows: list[list[list[int]]]
    ) -> tuple[PackedBatch, dict[int, tuple[int, int, int]]]:
        """The packed rows and each member's own tokens `(row, start, end)`: the whole sample,
        or with a shared prefix its completion (the prompt belongs to the unit)."""
        width = self.width(rows)
        if self.shared_prefix:
            return collate_shared_rows(
                rows, self.samples, self.prompt_lengths, width, self.pad_token_id
            )
        flat = [[member for unit in row for member in unit] for row in rows]
        packed = collate_rows(flat, self.samples, width, self.pad_token_id)
        spans = {}
        for row, members in enumerate(flat):
            offset = 0
            for member in members:
                end = offset + len(self.samples[member].input_ids)
                spans[member] = (row, offset, end)
                offset = end
        return packed, spans


def _micro_batch(
    rows: list[list[list[int]]],
    layout: Layout,
    batch: TrainingBatch,
    loss_counts: list[int],
    weigh: Callable[[torch.Tensor], torch.Tensor],
) -> MicroBatch:
    packed, spans = layout.collate(rows)
    temperature = torch.ones(packed.input_ids.shape)
    logprobs, advantages, versions, sequence_ids, members = [], [], [], [], []
    for member in (member for row in rows for unit in row for member in unit):  # row-major
        sample = batch.samples[member]
        row, start, end = spans[member]
        temperature[row, start:end] = sample.temperature
        if loss_counts[member] == 0:
            continue
        local_id = len(members)
        members.append(member)
        for index, keep in enumerate(sample.completion_mask):
            if keep:
                logprobs.append(sample.inference_logprobs[index])
                advantages.append(sample.advantages[index])
                versions.append(sample.policy_versions[index])
                sequence_ids.append(local_id)
    ids = torch.tensor(sequence_ids, dtype=torch.long)
    per_sequence = weigh(torch.tensor([loss_counts[m] for m in members]))
    return MicroBatch(
        packed=packed,
        temperature=temperature,
        inference_logprobs=torch.tensor(logprobs, dtype=torch.float32),
        advantages=torch.tensor(advantages, dtype=torch.float32),
        policy_versions=torch.tensor(versions, dtype=torch.long),
        sequence_ids=ids,
        token_weights=per_sequence[ids].float() if members else torch.zeros(0),
    )
