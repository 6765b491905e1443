"""Cascade attention: a group's shared prompt read once, the result each row's own attention.

The reference is attention written out in float64 over each row's own slot, key by key, so a
plan that pointed a row at the wrong keys, a merge that mis-weighted the two parts or a mask off
by one would differ by far more than the float32 rounding allowed here. The engine's check runs
the same seeded requests through an engine with cascade and one without.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.inference import engine as engine_module
from asyncrl.inference.cascade_attention import (
    CascadePlan,
    PlanIgnored,
    attending_by,
    cascade_attention,
    cascade_layers,
    plan_cascade,
    use_cascade_attention,
)
from asyncrl.inference.engine import Engine
from asyncrl.inference.sampling import SamplingParams

KV_HEADS, PER_KV, HEAD_DIM, MAX_LEN = 2, 3, 8, 40
SCALE = HEAD_DIM**-0.5
CPU = torch.device("cpu")
ONE_LAYER = types.SimpleNamespace(num_hidden_layers=1, sliding_window=None)


def reference(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: list[int],
    positions: list[int],
) -> torch.Tensor:
    """[rows, 1, heads, dim]: row i's heads over keys 0..positions[i] of its own slot."""
    rows = []
    for row, (slot, position) in enumerate(zip(slots, positions, strict=True)):
        heads = []
        for head in range(KV_HEADS * PER_KV):
            kv = head // PER_KV
            own_keys = keys[slot, kv, : position + 1].double()
            scores = own_keys @ query[row, head, 0].double() * SCALE
            heads.append(torch.softmax(scores, 0) @ values[slot, kv, : position + 1].double())
        rows.append(torch.stack(heads))
    return torch.stack(rows).unsqueeze(1).float()


def cache_with_groups(
    groups: list[list[int]], prompt_lens: list[int], seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random keys and values for every slot, with each group's prompt positions copied from
    its first slot into the others (as the engine's shared prefill does)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (16, KV_HEADS, MAX_LEN, HEAD_DIM)
    keys, values = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    for slots, length in zip(groups, prompt_lens, strict=True):
        for slot in slots[1:]:
            keys[slot, :, :length] = keys[slots[0], :, :length]
            values[slot, :, :length] = values[slots[0], :, :length]
    return keys, values


@pytest.mark.parametrize(
    ("groups", "prompt_lens", "grown"),
    [
        ([[0, 1, 2, 3], [4, 5, 6, 7]], [9, 9], [3, 5, 1, 8, 2, 2, 6, 4]),  # slots in place
        ([[3, 9, 1], [12], [6, 0]], [7, 12, 4], [2, 9, 1, 5, 3, 1]),  # gathered, a lone row
        ([[0, 1], [4, 5], [8, 9]], [5, 6, 8], [1, 1, 2, 7, 3, 3]),  # leaders a stride apart
    ],
)
def test_each_row_attends_to_its_own_keys_as_plain_attention_would(
    groups: list[list[int]], prompt_lens: list[int], grown: list[int]
) -> None:
    keys, values = cache_with_groups(groups, prompt_lens, seed=len(grown))
    slots = [slot for group in groups for slot in group]
    lens = [length for group, length in zip(groups, prompt_lens, strict=True) for _ in group]
    positions = [length + extra for length, extra in zip(lens, grown, strict=True)]
    prompt_keys = [index for index, group in enumerate(groups) for _ in group]
    plan = plan_cascade(slots, positions, lens, prompt_keys, ONE_LAYER, CPU)
    assert plan is not None
    query = torch.randn(len(slots), KV_HEADS * PER_KV, 1, HEAD_DIM)
    module = types.SimpleNamespace(layer_idx=0, num_key_value_groups=PER_KV)
    out, _ = cascade_attention(
        module, query, keys, values, None, scaling=SCALE, asyncrl_cascade_plan=plan
    )  # type: ignore[arg-type]
    expected = reference(query, keys, values, slots, positions)
    assert out.shape == expected.shape
    assert torch.allclose(out, expected, atol=2e-6), (out - expected).abs().max()


def test_no_plan_without_shared_prompts_an_empty_prompt_or_a_layer_to_use_it() -> None:
    assert plan_cascade([0, 1, 2], [5, 5, 5], [4, 4, 4], [7, 8, 9], ONE_LAYER, CPU) is None
    assert plan_cascade([0, 1], [5, 5], [0, 0], [7, 7], ONE_LAYER, CPU) is None
    past_every_window = types.SimpleNamespace(
        num_hidden_layers=2, sliding_window=4, layer_types=None
    )
    assert plan_cascade([0, 1], [5, 5], [4, 4], [7, 7], past_every_window, CPU) is None


def test_a_layer_outside_the_plan_is_plain_sdpa_on_the_keys_given() -> None:
    query = torch.randn(2, KV_HEADS * PER_KV, 1, HEAD_DIM)
    keys, values = torch.randn(2, KV_HEADS, 6, HEAD_DIM), torch.randn(2, KV_HEADS, 6, HEAD_DIM)
    config = types.SimpleNamespace(
        num_hidden_layers=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"]
    )
    plan = plan_cascade([0, 1], [5, 5], [4, 4], [3, 3], config, CPU)  # layer 0: past its window
    assert plan is not None and plan.layers == {1}
    module = types.SimpleNamespace(layer_idx=0, num_key_value_groups=PER_KV, is_causal=True)
    out, _ = cascade_attention(
        module, query, keys, values, None, scaling=SCALE, asyncrl_cascade_plan=plan
    )  # type: ignore[arg-type]
    expected = reference(query, keys, values, [0, 1], [5, 5])
    assert torch.allclose(out, expected, atol=2e-6)
    assert not plan.all_attended()  # layer 1 never attended: the engine voids such a pass


def test_sliding_layers_join_only_while_no_row_reaches_past_the_window() -> None:
    config = types.SimpleNamespace(
        sliding_window=8, layer_types=["sliding_attention", "full_attention", "sliding_attention"]
    )
    assert cascade_layers(config, 3, reach=8) == {0, 1, 2}
    assert cascade_layers(config, 3, reach=9) == {1}
    every_layer_slides = types.SimpleNamespace(sliding_window=8, layer_types=None)
    assert cascade_layers(every_layer_slides, 2, reach=9) == set()
    assert cascade_layers(types.SimpleNamespace(sliding_window=None), 2, reach=99) == {0, 1}


def test_the_engine_samples_the_same_with_and_without_cascade(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeded groups of different prompt lengths, decoded together; with cascade the tokens
    are the same and the logprobs equal to float rounding. A request of one sample is in the
    mix, and the passes with cascade are counted (a plan never made would prove nothing)."""
    plans: list[CascadePlan | None] = []

    def counted(*args: object) -> CascadePlan | None:
        plans.append(plan_cascade(*args))  # type: ignore[arg-type]
        return plans[-1]

    monkeypatch.setattr(engine_module, "plan_cascade", counted)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [[5 + i % 30 for i in range(length)] for length in (23, 9, 31, 14)]
    results = {}
    for cascade in (False, True):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        engine = Engine(model, tokenizer, max_num_seqs=16, max_model_len=128, cascade=cascade)
        assert engine.cascade is cascade
        try:
            requests = [
                engine.submit(
                    prompt, SamplingParams(max_tokens=12, temperature=1.0, seed=i, logprobs=0), n=n
                )
                for i, (prompt, n) in enumerate(zip(prompts, (4, 5, 1, 3), strict=True))
            ]
            results[cascade] = [o for r in requests for o in r.done.result(timeout=60)]
        finally:
            engine.shutdown()
    planned = [plan for plan in plans if plan is not None]
    assert len(planned) >= 11  # every decode pass of the 12 tokens but the last's
    assert max(plan.prefix_mask.shape[0] for plan in planned) == 4  # the groups of 4, 5, 1, 3
    for plain, cascaded in zip(results[False], results[True], strict=True):
        assert cascaded.token_ids == plain.token_ids
        assert cascaded.logprobs == pytest.approx(plain.logprobs, abs=1e-5)


def test_only_a_cpu_float32_sdpa_model_attends_this_way(tiny_model_dir: Path) -> None:
    bf16 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    assert not use_cascade_attention(bf16)
    eager = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="eager"
    )
    assert not use_cascade_attention(eager)
    with_sinks = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with_sinks.model.layers[0].self_attn.sinks = torch.nn.Parameter(torch.zeros(2))  # gpt-oss's
    assert not use_cascade_attention(with_sinks)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert use_cascade_attention(plain)


def test_siblings_share_prompt_keys_only_when_copied_from_one_prefill(tiny_model_dir: Path) -> None:
    """Three slots for five samples: the first three are prefilled together (one runs the
    prompt, two copy it), the last two later, after the first three finish — their keys come
    from another prefill and must not be read as the first three's."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = Engine(model, tokenizer, max_num_seqs=3, max_model_len=64)
    try:
        params = SamplingParams(max_tokens=4, temperature=1.0, seed=0, ignore_eos=True)
        request = engine.submit([5 + i for i in range(12)], params, n=5)
        request.done.result(timeout=60)
    finally:
        engine.shutdown()
    keys = [sequence.prompt_keys for sequence in request.sequences]
    assert keys[0] == keys[1] == keys[2]
    assert keys[3] == keys[4] != keys[0]


def test_a_pass_the_model_did_not_attend_by_plan_fails_and_turns_cascade_off(
    tiny_model_dir: Path,
) -> None:
    """A model whose attention ignores the plan (here: switched back to plain SDPA after the
    engine chose cascade) sees every slot's keys: that pass's requests are aborted, cascade goes
    off, and the next request is served as without it."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = Engine(model, tokenizer, max_num_seqs=4, max_model_len=64)
    assert engine.cascade
    model.config._attn_implementation = "sdpa"
    try:
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        void = engine.submit([5, 6, 7, 8], params, n=2).done.result(timeout=60)
        assert {output.finish_reason for output in void} == {"abort"}
        assert not engine.cascade
        after = engine.submit([5, 6, 7, 8], params, n=2).done.result(timeout=60)
        assert [len(output.token_ids) for output in after] == [4, 4]
    finally:
        engine.shutdown()


def test_a_plan_not_attended_by_every_layer_raises_even_where_the_pass_did_not() -> None:
    plan = plan_cascade([0, 1], [5, 5], [4, 4], [3, 3], ONE_LAYER, CPU)
    assert plan is not None
    with (
        pytest.raises(PlanIgnored, match=r"llama's layers \[0\] did not attend"),
        attending_by(plan, "llama"),
    ):
        pass
    plan.attended.append(0)
    with attending_by(plan, "llama"):
        pass
