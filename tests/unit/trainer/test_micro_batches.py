from __future__ import annotations

import pytest
import torch

from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.types import TrainingBatch, TrainingSample


def make(prompt: list[int], completion: list[int], mask: list[bool], tag: float) -> TrainingSample:
    n = len(completion)
    return TrainingSample(
        prompt_ids=prompt, completion_ids=completion, completion_mask=mask,
        inference_logprobs=[-tag - i / 10 for i in range(n)],
        advantages=[tag] * n, policy_versions=[int(tag)] * n, temperature=0.5 + tag / 10,
        env="e",
    )  # fmt: skip


BATCH = TrainingBatch(
    step=1,
    samples=[
        make([1, 2], [10, 11, 12], [True, False, True], 1.0),  # 5 tokens, 2 trained
        make([3], [20, 21], [True, True], 2.0),  # 3 tokens, 2 trained
        make([4, 5, 6], [30], [False], 3.0),  # 4 tokens, nothing trained
        make([7], [40, 41, 42, 43], [True] * 4, 4.0),  # 5 tokens, 4 trained
    ],
)


def test_per_token_tensors_line_up_with_loss_tokens() -> None:
    micro_batches = build_micro_batches(BATCH, 8, 1, 0, "token")
    for mb in micro_batches:
        targets = mb.packed.input_ids[:, 1:][mb.packed.loss_mask[:, 1:]]
        owners = mb.packed.sample_index[:, 1:][mb.packed.loss_mask[:, 1:]]
        assert targets.numel() == mb.num_loss_tokens
        for position, (token, owner) in enumerate(
            zip(targets.tolist(), owners.tolist(), strict=True)
        ):
            sample = BATCH.samples[owner]
            k = sample.completion_ids.index(token)
            assert sample.completion_mask[k]
            assert mb.inference_logprobs[position].item() == pytest.approx(
                sample.inference_logprobs[k]
            )
            assert mb.advantages[position].item() == sample.advantages[k]
            assert mb.policy_versions[position].item() == sample.policy_versions[k]
        # each token carries its sample's temperature
        for row in range(mb.packed.input_ids.shape[0]):
            for col in range(mb.packed.input_ids.shape[1]):
                owner = int(mb.packed.sample_index[row, col])
                if owner >= 0:
                    assert mb.temperature[row, col].item() == pytest.approx(
                        BATCH.samples[owner].temperature
                    )


@pytest.mark.parametrize("kind", ["token", "sequence", "constant"])
def test_weights_sum_over_the_step_not_per_micro_batch(kind: str) -> None:
    micro_batches = build_micro_batches(BATCH, 8, 1, 0, kind)
    assert len(micro_batches) > 1
    total = sum(float(mb.token_weights.sum()) for mb in micro_batches)
    # 8 trained tokens in 3 trained sequences of 2, 2 and 4 tokens; the longest has 4
    expected = {"token": 1.0, "sequence": 1.0, "constant": 8 / (3 * 4)}[kind]
    assert total == pytest.approx(expected)


def test_sample_longer_than_sequence_len_is_refused() -> None:
    with pytest.raises(ValueError, match="sample 0 has 5 tokens, more than sequence_len 4"):
        build_micro_batches(BATCH, 4, 1, 0, "token")


def test_rows_per_micro_batch_groups_rows() -> None:
    single = build_micro_batches(BATCH, 8, 1, 0, "token")
    grouped = build_micro_batches(BATCH, 8, 8, 0, "token")
    assert len(grouped) == 1
    assert sum(mb.num_loss_tokens for mb in single) == grouped[0].num_loss_tokens == 8
    assert torch.equal(
        torch.sort(torch.cat([mb.advantages for mb in single])).values,
        torch.sort(grouped[0].advantages).values,
    )


def test_without_packing_each_sample_has_its_own_row() -> None:
    micro_batches = build_micro_batches(BATCH, 8, 8, 0, "token", packing=False)
    rows = micro_batches[0].packed.sample_index
    assert rows.shape == (4, 8)
    assert [sorted(set(row.tolist()) - {-1}) for row in rows] == [[0], [1], [2], [3]]


def _weights_by_token(micro_batches: list) -> list[tuple[float, float]]:
    """(advantage, normalisation weight) of every loss token, sorted: what the loss sees."""
    pairs = []
    for mb in micro_batches:
        pairs += zip(mb.advantages.tolist(), mb.token_weights.tolist(), strict=True)
    return sorted(pairs)


@pytest.mark.parametrize("normalisation", ["token", "sequence", "constant"])
def test_ranks_shares_carry_the_whole_batchs_weights(normalisation: str) -> None:
    whole = build_micro_batches(BATCH, 8, 1, 0, normalisation)
    shares = [[0, 2], [1, 3]]  # two ranks' samples
    split = [mb for share in shares
             for mb in build_micro_batches(BATCH, 8, 1, 0, normalisation, only=share)]  # fmt: skip
    assert _weights_by_token(split) == _weights_by_token(whole)
    only_first = build_micro_batches(BATCH, 8, 1, 0, normalisation, only=[0])
    assert {int(i) for mb in only_first for i in mb.packed.sample_index.flatten() if i >= 0} == {0}


def test_gradient_accumulation_spreads_rows_over_more_passes() -> None:
    assert len(build_micro_batches(BATCH, 8, 4, 0, "token")) == 1
    spread = build_micro_batches(BATCH, 8, 4, 0, "token", min_micro_batches=3)
    assert len(spread) == 3  # three rows of ≤ 8 tokens, one per pass
    whole = build_micro_batches(BATCH, 8, 4, 0, "token")
    assert _weights_by_token(spread) == _weights_by_token(whole)


def dr_grpo_weights(batch: TrainingBatch, length: str) -> list[float]:
    """Each trained token's weight, as the trainer builds them for a dr_grpo step."""
    from asyncrl.config.trainer import TrainerConfig
    from asyncrl.trainer.parallel import SINGLE_PROCESS
    from asyncrl.trainer.train import this_ranks_micro_batches

    config = TrainerConfig(model="m", sequence_len=8, per_device_train_batch_size=8,
                           loss={"type": "dr_grpo", "dr_grpo_length": length})  # fmt: skip
    micro_batches = this_ranks_micro_batches(batch, config, SINGLE_PROCESS, pad_token_id=0)
    return [w for mb in micro_batches for w in mb.token_weights.tolist()]


def test_dr_grpo_divides_by_the_generation_budget_the_batch_carries() -> None:
    with_budget = TrainingBatch(BATCH.step, BATCH.samples, max_tokens=16)
    # 3 trained sequences × the budget of 16 tokens, not × the longest completion (4)
    assert dr_grpo_weights(with_budget, "max_tokens") == pytest.approx([1 / 48] * 8)
    assert dr_grpo_weights(with_budget, "longest") == pytest.approx([1 / 12] * 8)
    assert dr_grpo_weights(BATCH, "max_tokens") == pytest.approx([1 / 12] * 8)  # no budget known


def test_dr_grpo_step_size_does_not_move_with_the_other_completions() -> None:
    first = make([1], [10, 11], [True] * 2, 1.0)
    short = TrainingBatch(1, [first, make([2], [20], [True], 2.0)], max_tokens=6)
    long = TrainingBatch(1, [first, make([2], [20, 21, 22, 23, 24], [True] * 5, 2.0)], max_tokens=6)
    assert dr_grpo_weights(short, "max_tokens")[0] == dr_grpo_weights(long, "max_tokens")[0]
    assert dr_grpo_weights(short, "longest")[0] != dr_grpo_weights(long, "longest")[0]
