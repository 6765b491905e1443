"""A colocated engine's sleep and wake: the KV cache is freed while asleep, sequences cut off by
a sleep are recomputed and finish as if never interrupted, and a request that arrives while the
trainer steps waits and is answered by the weights installed before the wake."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.inference.engine import Engine
from asyncrl.inference.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)


def make_engine(model_dir: Path) -> Engine:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return Engine(model, tokenizer, max_num_seqs=4, max_model_len=256)


@pytest.fixture
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    engine = make_engine(tiny_model_dir)
    yield engine
    engine.shutdown()


def test_sleep_frees_the_kv_cache_and_wake_gives_it_back(engine: Engine) -> None:
    awake = engine.cache.nbytes
    assert awake > 0
    assert engine.sleep() == awake
    assert engine.cache.nbytes == 0
    engine.wake()
    assert engine.cache.nbytes == awake
    output = engine.submit([70, 71], GREEDY).done.result(timeout=60)[0]
    assert len(output.token_ids) == GREEDY.max_tokens


def test_sequences_cut_off_by_a_sleep_finish_with_the_same_tokens(engine: Engine) -> None:
    prompts = [[70, 71, 72], [80, 81], [90]]
    alone = [engine.submit(p, GREEDY).done.result(timeout=60)[0].token_ids for p in prompts]
    requests = [engine.submit(p, GREEDY) for p in prompts]
    while not all(r.sequences[0].output_ids for r in requests):
        time.sleep(0.001)
    engine.sleep()
    cut_at = [len(r.sequences[0].output_ids) for r in requests]
    assert all(0 < n < GREEDY.max_tokens for n in cut_at)  # really mid-generation
    time.sleep(0.2)
    assert [len(r.sequences[0].output_ids) for r in requests] == cut_at  # nothing while asleep
    engine.wake()
    # recomputing prompt + tokens so far rebuilds the same cache: greedy continues identically
    assert [r.done.result(timeout=60)[0].token_ids for r in requests] == alone


def test_a_request_during_sleep_is_answered_by_the_new_weights(
    engine: Engine, tiny_model_dir: Path
) -> None:
    prompt = [75, 76, 77]
    before = engine.submit(prompt, GREEDY).done.result(timeout=60)[0].token_ids
    engine.sleep()
    waiting = engine.submit(prompt, GREEDY)
    with torch.no_grad():  # the "training step": new weights, in place, as a colocated trainer
        for parameter in engine.model.parameters():
            parameter.add_(torch.randn_like(parameter), alpha=0.5)
        perturbed = {n: p.clone() for n, p in engine.model.named_parameters()}
    engine.weight_version = 1
    time.sleep(0.2)
    assert not waiting.done.done() and not waiting.sequences[0].output_ids
    engine.wake()
    answer = waiting.done.result(timeout=60)[0]
    # an independent engine built on the perturbed weights gives the same greedy tokens
    reference = make_engine(tiny_model_dir)
    try:
        with torch.no_grad():
            for name, parameter in reference.model.named_parameters():
                parameter.copy_(perturbed[name])
        expected = reference.submit(prompt, GREEDY).done.result(timeout=60)[0].token_ids
    finally:
        reference.shutdown()
    assert answer.token_ids == expected != before
    assert set(answer.policy_versions) == {1}
