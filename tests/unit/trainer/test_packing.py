from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.packing import Sample, collate_rows, first_fit_decreasing


def test_first_fit_decreasing_hand_worked() -> None:
    # sorted: 7(i1), 5(i0), 4(i3), 3(i2), 2(i4), 1(i5); capacity 10
    # 7 -> bin0 (3 left); 5 -> bin1 (5 left); 4 -> bin1 (1 left); 3 -> bin0 (0 left);
    # 2 -> bin2 (8 left); 1 -> bin1 (0 left)
    assert first_fit_decreasing([5, 7, 3, 4, 2, 1], 10) == [[1, 2], [0, 3, 5], [4]]


def test_first_fit_decreasing_keeps_every_item_within_capacity() -> None:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 60, (500,), generator=generator).tolist()
    bins = first_fit_decreasing(lengths, 64)
    assert sorted(i for b in bins for i in b) == list(range(500))
    assert all(sum(lengths[i] for i in b) <= 64 for b in bins)


def test_sample_longer_than_a_row_is_refused_by_index() -> None:
    with pytest.raises(ValueError, match="index 1, 9 tokens"):
        first_fit_decreasing([3, 9], 8)


def test_collate_lays_out_samples_with_restarting_positions() -> None:
    samples = [
        Sample([10, 11, 12], [False, True, True]),
        Sample([20, 21], [False, True]),
        Sample([30, 31, 32, 33], [False, False, True, True]),
    ]
    batch = collate_rows([[0, 1], [2]], samples, seq_len=6, pad_token_id=0)
    assert batch.input_ids.tolist() == [[10, 11, 12, 20, 21, 0], [30, 31, 32, 33, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    assert batch.loss_mask.tolist() == [
        [False, True, True, False, True, False],
        [False, False, True, True, False, False],
    ]
    assert batch.sample_index.tolist() == [[0, 0, 0, 1, 1, -1], [2, 2, 2, 2, -1, -1]]
    assert batch.num_loss_tokens == 5


def test_mismatched_mask_is_refused() -> None:
    with pytest.raises(ValueError, match="3 tokens but 2 mask entries"):
        Sample([1, 2, 3], [True, False])


@pytest.mark.parametrize("arch_fixture", ["tiny_model_dir", "tiny_qwen_dir"])
def test_packed_logprobs_match_each_sample_alone(
    arch_fixture: str, request: pytest.FixtureRequest
) -> None:
    """Packing must not let attention cross samples: the reference runs each sample by itself."""
    model_dir: Path = request.getfixturevalue(arch_fixture)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    generator = torch.Generator().manual_seed(1)
    lengths = [5, 17, 9, 30, 2, 12, 23, 8]
    samples = [
        Sample(
            torch.randint(4, 100, (n,), generator=generator).tolist(), [False] + [True] * (n - 1)
        )
        for n in lengths
    ]
    rows = first_fit_decreasing(lengths, 40)
    batch = collate_rows(rows, samples, seq_len=40, pad_token_id=0)
    temperature = 0.7
    with torch.no_grad():
        packed = completion_logprobs(model, batch, temperature=temperature, chunk_size=7)
        # loss tokens come out in row-major order; map each back to its sample
        owners = batch.sample_index[:, 1:][batch.loss_mask[:, 1:]]
        for index, sample in enumerate(samples):
            # independent reference: one unpadded forward pass, plain log_softmax per position
            logits = model(torch.tensor([sample.input_ids])).logits[0].float() / temperature
            expected = [
                torch.log_softmax(logits[t - 1], dim=-1)[sample.input_ids[t]].item()
                for t in range(1, len(sample.input_ids))
            ]
            got = packed.logprobs[owners == index]
            assert got.shape[0] == len(expected)
            assert torch.allclose(got, torch.tensor(expected), atol=1e-5), index
