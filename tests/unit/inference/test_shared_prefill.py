"""A request for n completions prefills its prompt once: the other n − 1 sequences copy its keys
and values and sample from its last logits. Tokens and logprobs equal n separate requests
(greedy, and seeded sampling), before and after a weight update; a preempted sequence, with
tokens of its own, is prefilled alone. Requests admitted together whose prompts begin with the
same head run it once; their tokens and logprobs equal an engine that prefills every row apart."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.inference.engine import Engine
from asyncrl.inference.prefill_plan import share_prompts, shared_head
from asyncrl.inference.sampling import SamplingParams
from asyncrl.inference.sequences import Request, Sequence

PROMPT = [70, 71, 72, 73, 74, 75, 76, 77, 78]
N = 4


def together_and_apart(engine: Engine, params: SamplingParams) -> tuple[list, list]:
    """The n completions of one request, and n requests of one completion each (seed + i)."""
    together = engine.submit(PROMPT, params, n=N).done.result(timeout=60)
    apart = []
    for index in range(N):
        seed = None if params.seed is None else params.seed + index
        alone = SamplingParams(**{**params.__dict__, "seed": seed})
        apart.append(engine.submit(PROMPT, alone).done.result(timeout=60)[0])
    return together, apart


def assert_same(together: list, apart: list) -> None:
    for shared, alone in zip(together, apart, strict=True):
        assert shared.token_ids == alone.token_ids
        assert shared.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


GREEDY_AND_SEEDED = pytest.mark.parametrize(
    "params",
    [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
     SamplingParams(max_tokens=24, temperature=1.0, seed=11, ignore_eos=True)],
    ids=["greedy", "seeded"],
)  # fmt: skip


@GREEDY_AND_SEEDED
def test_n_completions_equal_n_requests_and_the_prompt_runs_once(
    engine: Engine, params: SamplingParams
) -> None:
    before = engine.stats.prefill_tokens
    together = engine.submit(PROMPT, params, n=N).done.result(timeout=60)
    assert engine.stats.prefill_tokens - before == len(PROMPT)  # once, not N times
    assert_same(together, together_and_apart(engine, params)[1])
    if params.temperature > 0:  # seeded sampling still differs between the n
        assert len({tuple(c.token_ids) for c in together}) > 1


def test_still_equal_after_a_weight_update(engine: Engine) -> None:
    def update() -> None:
        with torch.no_grad():
            for parameter in engine.model.parameters():
                parameter.mul_(1.05)
        engine.weight_version = 1

    engine.run_exclusive(update, timeout=60)
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=5, ignore_eos=True)
    together, apart = together_and_apart(engine, params)
    assert_same(together, apart)
    assert all(set(c.policy_versions) == {1} for c in together)


def test_a_preempted_sequence_is_prefilled_alone() -> None:
    request = Request("r", [1, 2, 3], SamplingParams(), 3, Future())
    fresh, preempted, sibling = (Sequence(request, i, None) for i in range(3))
    preempted.output_ids = [9, 9]  # its keys and values were freed by a sleep
    other = Request("o", [1, 2, 3], SamplingParams(), 1, Future())
    stranger = Sequence(other, 0, None)
    run, source = share_prompts([fresh, preempted, sibling, stranger])
    assert run == [fresh, preempted, stranger]
    assert source == [0, 1, 0, 2]  # the same prompt in another request is not shared


HEAD = [60 + i % 20 for i in range(30)]  # a system prompt every request begins with
TAILS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [3, 2]]


def submitted_together(engine: Engine, params: SamplingParams, n: int) -> list[list]:
    """Every request admitted in one step (held by a pause, then released at once)."""
    engine.pause("keep")
    requests = [engine.submit(HEAD + tail, params, n=n) for tail in TAILS]
    engine.resume()
    return [request.done.result(timeout=60) for request in requests]


@GREEDY_AND_SEEDED
def test_a_head_several_requests_share_runs_once_and_changes_no_token(
    tiny_model_dir: Path, params: SamplingParams
) -> None:
    """Against an engine that prefills every row on its own (`share_prompts=False`)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # the longest prompt and its answer fill a slot exactly, as `asyncrl eval` sizes them: a
    # pass must not count a sibling's whole prompt beside its leader's start past the head
    fits = len(HEAD) + max(len(t) for t in TAILS) + params.max_tokens
    shared = Engine(model, tokenizer, max_num_seqs=8, max_model_len=fits)
    apart = Engine(model, tokenizer, max_num_seqs=8, max_model_len=fits, share_prompts=False)
    try:
        together = submitted_together(shared, params, n=2)
        alone = submitted_together(apart, params, n=2)
        # the head once, then each request's own tokens once (its 2 samples share them)
        assert shared.stats.prefill_tokens == len(HEAD) + sum(len(t) for t in TAILS)
        assert apart.stats.prefill_tokens == 2 * sum(len(HEAD) + len(t) for t in TAILS)
    finally:
        shared.shutdown()
        apart.shutdown()
    for with_head, without in zip(together, alone, strict=True):
        assert_same(with_head, without)


def test_the_shared_head_leaves_every_prompt_a_token_and_needs_two_requests() -> None:
    def leading(prompt: list[int], cached: int = 0) -> Sequence:
        sequence = Sequence(Request("r", prompt, SamplingParams(), 1, Future()), 0, None)
        sequence.cached = cached
        return sequence

    same = [leading([*HEAD, 1]), leading([*HEAD, 1])]
    assert shared_head(same)[1] == len(HEAD)  # the whole prompt but its last token
    a, b = leading([*HEAD, 1, 2]), leading([*HEAD[:20], 9])
    assert shared_head([a, b]) == ([a, b], 20)
    assert shared_head([leading([*HEAD, 1])]) == ([], 0)  # one request: nothing to share
    short = [leading([*HEAD[:10], 1]), leading([*HEAD[:10], 2])]
    assert shared_head(short) == ([], 0)  # under MIN_SHARED_HEAD
    hit = leading([*HEAD, 3], cached=25)  # the prefix cache gave it its head already
    assert shared_head([a, hit]) == ([], 0)
