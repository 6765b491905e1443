"""A request for n completions prefills its prompt once: the other n − 1 sequences copy its keys
and values and sample from its last logits. Tokens and logprobs equal n separate requests
(greedy, and seeded sampling), before and after a weight update; a preempted sequence, with
tokens of its own, is prefilled alone."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
import torch

from asyncrl.inference.engine import Engine
from asyncrl.inference.prefill_plan import share_prompts
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


@pytest.mark.parametrize(
    "params",
    [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
     SamplingParams(max_tokens=24, temperature=1.0, seed=11, ignore_eos=True)],
    ids=["greedy", "seeded"],
)  # fmt: skip
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
