"""Decode passes: rows split off by length only where the key positions spared repay a pass."""

from __future__ import annotations

import random
from concurrent.futures import Future

import pytest

from asyncrl.inference.decode_plan import SPLIT_WORTH_KEY_POSITIONS, decode_passes
from asyncrl.inference.sampling import SamplingParams
from asyncrl.inference.sequences import Request, Sequence


def running(*lengths: int) -> list[Sequence]:
    """Sequences with `lengths` tokens in the cache (a prompt and one sampled token each)."""
    sequences = []
    for index, length in enumerate(lengths):
        request = Request(f"r{index}", [7] * length, SamplingParams(), 1, Future())
        sequences.append(Sequence(request, 0, None, slot=index, output_ids=[9]))
    return sequences


def cost(passes: list[list[Sequence]], worth: int) -> int:
    """The model `decode_passes` weighs: a pass costs `worth`, each row its pass's longest."""
    return sum(worth + len(p) * max(s.cached_len for s in p) for p in passes)


def test_one_long_sequence_among_short_ones_decodes_in_a_pass_of_its_own() -> None:
    sequences = running(*[40] * 15, 500, *[40] * 16)
    passes = decode_passes(sequences)
    assert [len(p) for p in passes] == [31, 1]
    assert passes[1][0].cached_len == 500
    assert passes[0] == [s for s in sequences if s.cached_len == 40]  # order kept


def test_close_lengths_stay_in_one_pass_as_given() -> None:
    sequences = running(40, 90, 60, 120, 45)  # 180 key positions spared at best
    assert decode_passes(sequences) == [sequences]
    assert decode_passes([]) == []


def test_three_clusters_give_three_passes() -> None:
    sequences = running(*[20] * 24, *[260] * 24, *[520] * 24)
    assert sorted({s.cached_len for s in p}.pop() for p in decode_passes(sequences)) == [
        20, 260, 520,
    ]  # fmt: skip


@pytest.mark.parametrize("seed", range(20))
def test_every_row_once_in_order_and_no_costlier_than_one_pass(seed: int) -> None:
    generator = random.Random(seed)
    lengths = [int(5 * 100 ** generator.random()) for _ in range(generator.randrange(1, 65))]
    sequences = running(*lengths)
    passes = decode_passes(sequences)
    flat = [s for p in passes for s in p]
    assert sorted(map(id, flat)) == sorted(map(id, sequences))
    for p in passes:
        positions = [sequences.index(s) for s in p]
        assert positions == sorted(positions)
    worth = SPLIT_WORTH_KEY_POSITIONS
    assert cost(passes, worth) <= cost([sequences], worth)
