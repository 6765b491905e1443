"""The pure parts of the multi-rank trainer: how a batch's samples are split across ranks."""

from __future__ import annotations

import pytest

from asyncrl.trainer.parallel import split_by_tokens


def test_samples_go_to_the_rank_with_the_fewest_tokens_longest_first() -> None:
    assert split_by_tokens([100, 10, 10, 10], 2) == [[0], [1, 2, 3]]
    assert split_by_tokens([5, 7, 3, 9], 2) == [[2, 3], [0, 1]]  # 9, 7, then 5 and 3: 12 each


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_every_sample_lands_on_exactly_one_rank_in_batch_order(world_size: int) -> None:
    lengths = [(i * 37) % 23 + 1 for i in range(20)]
    shares = split_by_tokens(lengths, world_size)
    assert len(shares) == world_size
    assert sorted(i for share in shares for i in share) == list(range(20))
    assert all(share == sorted(share) for share in shares)
    loads = [sum(lengths[i] for i in share) for share in shares]
    assert max(loads) - min(loads) <= max(lengths)  # balanced to within one sample


def test_more_ranks_than_samples_leaves_some_ranks_empty() -> None:
    assert split_by_tokens([4], 2) == [[0], []]
