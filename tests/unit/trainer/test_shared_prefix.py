"""Shared-prefix packing changes nothing but the work: per-token logprobs, entropies, every loss
type and every gradient equal those of one-sample-at-a-time packing (float32, ≤ 1e-5), on a
batch with groups of different prompt lengths, masked and truncated completions, a singleton,
a group too long for one row (kept whole in a wider row, or split over rows), and with LoRA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from asyncrl.config.trainer import LossConfig, TrainerConfig
from asyncrl.trainer import shared_prefix
from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.loss import NORMALISATION, LossInputs, compute_loss
from asyncrl.trainer.micro_batches import MicroBatch, build_micro_batches
from asyncrl.trainer.parallel import SINGLE_PROCESS
from asyncrl.trainer.shared_prefix import group_rows, prompt_units
from asyncrl.trainer.train import this_ranks_micro_batches
from asyncrl.types import TrainingBatch, TrainingSample

SEQ_LEN = 40
LOSS_TYPES = ["masked_is", "grpo_clip", "dapo", "dr_grpo", "gspo", "cispo"]


def sample(prompt: list[int], completion: list[int], mask: list[bool] | None = None,
           advantage: float = 1.0, temperature: float = 1.0) -> TrainingSample:  # fmt: skip
    n = len(completion)
    return TrainingSample(
        prompt_ids=prompt, completion_ids=completion,
        completion_mask=mask if mask is not None else [True] * n,
        inference_logprobs=[-1.0 - i / 7 for i in range(n)], advantages=[advantage] * n,
        policy_versions=[0] * n, temperature=temperature, env="e",
    )  # fmt: skip


def batch() -> TrainingBatch:
    long_prompt = list(range(30, 42))  # 12 tokens: its group of 4 is 12 + 31 > SEQ_LEN
    short_prompt = [50, 51, 52]
    samples = [
        sample(long_prompt, [60, 61, 62, 63, 64, 65, 66, 67, 68, 69], advantage=1.5),
        sample(short_prompt, [70, 71, 72], advantage=-0.5, temperature=0.7),
        sample(long_prompt, [61, 60, 62, 70, 71], [True, False, True, True, False]),
        sample(short_prompt, [73, 74], advantage=0.5, temperature=0.7),
        sample(long_prompt, [62, 63, 64, 65, 66, 67, 68, 69], advantage=-1.0),
        sample([80, 81, 82, 83, 84], [90, 91, 92, 93], advantage=2.0),  # a singleton
        sample(long_prompt, [66, 65, 64, 63, 62, 61, 60, 59], advantage=-1.0),  # truncated
        sample(short_prompt, [75, 76, 77, 78, 79], [True, True, False, False, False]),
    ]
    return TrainingBatch(step=1, samples=samples, max_tokens=10)


def model(tiny_model_dir: Path, lora: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    loaded = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    if not lora:
        return loaded
    adapted = get_peft_model(loaded, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for name, parameter in adapted.named_parameters():
        if "lora_B" in name:  # non-zero, so the adapter changes the logprobs
            torch.nn.init.normal_(parameter, std=0.02)
    return adapted


@pytest.fixture(params=["whole", "split"])
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of laying out the group too long for one row: kept whole in a wider row (what
    `group_rows` picks for this batch) and split over rows (what it picks where a whole group
    would pass `WIDEST_ROW` × the row)."""
    if request.param == "split":
        monkeypatch.setattr(shared_prefix, "WIDEST_ROW", 1)
    return str(request.param)


def micro_batches(shared: bool, normalisation: str = "token") -> list[MicroBatch]:
    return build_micro_batches(batch(), SEQ_LEN, 2, 0, normalisation, shared_prefix=shared)


def per_token(net: torch.nn.Module, mbs: list[MicroBatch]) -> dict[tuple[int, int], tuple]:
    """(sample, completion position) -> (logprob, entropy), whatever the layout."""
    found = {}
    for mb in mbs:
        result = completion_logprobs(net, mb.packed, mb.temperature)
        loss_positions = mb.packed.loss_mask.nonzero(as_tuple=True)
        owners = mb.packed.sample_index[loss_positions].tolist()
        positions = mb.packed.position_ids[loss_positions].tolist()
        for key, logprob, entropy in zip(
            zip(owners, positions, strict=True), result.logprobs, result.entropy, strict=True
        ):
            found[key] = (logprob.item(), entropy.item())
    return found


def test_a_group_is_its_prompt_once_and_a_long_group_is_whole_or_split(layout: str) -> None:
    samples = batch().samples
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    units = prompt_units([s.prompt_ids for s in samples], lengths, range(8), SEQ_LEN)
    assert units == [[0, 2, 4], [6], [1, 3, 7], [5]]  # the long group does not fit one row

    def laid_out(mbs: list[MicroBatch]) -> int:
        return sum(int((mb.packed.sample_index >= 0).sum()) for mb in mbs)

    completions = sum(len(s.completion_ids) for s in samples)
    assert laid_out(micro_batches(False)) == sum(len(s.prompt_ids) for s in samples) + completions
    shared = micro_batches(True)
    widest = max(mb.packed.input_ids.shape[1] for mb in shared)
    if layout == "whole":  # a prompt per group, in a row wider than SEQ_LEN
        assert laid_out(shared) == 12 + 3 + 5 + completions
        assert SEQ_LEN < widest <= 2 * SEQ_LEN
    else:  # a prompt per unit
        assert laid_out(shared) == 12 + 12 + 3 + 5 + completions
        assert widest <= SEQ_LEN


def test_the_layout_with_fewer_positions_is_chosen() -> None:
    """The quick start's long answers: 4 groups of 8 × 32 tokens behind 65-token prompts, rows
    of 256. Split, each group is a 5-answer and a 3-answer unit that cannot share a row: 8 rows
    × 256; whole, 4 rows × 328. Short answers fit a row as they are; a group past twice the
    row is split."""

    def rows_of(completion: int, group: int = 8, prompts: int = 4) -> object:
        prompt_ids = [[p] * 65 for p in range(prompts) for _ in range(group)]
        lengths = [65 + completion] * len(prompt_ids)
        return group_rows(prompt_ids, lengths, range(len(prompt_ids)), 256, 8)

    long = rows_of(32)
    assert (long.capacity, len(long.rows), long.positions) == (336, 4, 4 * 336)
    assert long.rows_per_pass * long.capacity <= 8 * 256  # a pass holds no more than before
    short = rows_of(20)  # 65 + 8 × 20 = 225: a group per row of 256
    assert (short.capacity, len(short.rows)) == (256, 4)
    huge = rows_of(70)  # 65 + 8 × 70 = 625 > 2 × 256
    assert huge.capacity == 256


def test_logprobs_and_entropies_equal_unshared_packing(tiny_model_dir: Path, layout: str) -> None:
    net = model(tiny_model_dir)
    with torch.no_grad():
        shared, plain = per_token(net, micro_batches(True)), per_token(net, micro_batches(False))
    assert len(plain) == sum(sum(s.completion_mask) for s in batch().samples)
    assert shared.keys() == plain.keys()
    for key, (logprob, entropy) in plain.items():
        assert shared[key][0] == pytest.approx(logprob, abs=1e-5)
        assert shared[key][1] == pytest.approx(entropy, abs=1e-5)


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_and_gradient_equals_unshared_packing(
    tiny_model_dir: Path, loss_type: str, lora: bool, layout: str
) -> None:
    config = LossConfig(type=loss_type)

    def loss_and_grads(shared: bool) -> tuple[float, dict[str, torch.Tensor]]:
        net = model(tiny_model_dir, lora)
        total = 0.0
        for mb in micro_batches(shared, NORMALISATION[loss_type]):
            current = completion_logprobs(net, mb.packed, mb.temperature)
            output = compute_loss(
                LossInputs(
                    logprobs=current.logprobs, inference_logprobs=mb.inference_logprobs,
                    advantages=mb.advantages, sequence_ids=mb.sequence_ids,
                    token_weights=mb.token_weights,
                ),
                config,
            )  # fmt: skip
            output.loss.backward()
            total += output.loss.item()
        grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
        return total, grads

    shared_loss, shared_grads = loss_and_grads(True)
    plain_loss, plain_grads = loss_and_grads(False)
    assert shared_loss == pytest.approx(plain_loss, abs=1e-5)
    assert shared_grads.keys() == plain_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_the_trainer_packs_shared_prefixes_when_configured(tiny_model_dir: Path) -> None:
    def packed(shared: bool) -> list[MicroBatch]:
        config = TrainerConfig(model=str(tiny_model_dir), sequence_len=SEQ_LEN,
                               shared_prefix=shared)  # fmt: skip
        return this_ranks_micro_batches(batch(), config, SINGLE_PROCESS, 0)

    assert all(mb.packed.attention_mask is not None for mb in packed(True))
    assert all(mb.packed.attention_mask is None for mb in packed(False))
