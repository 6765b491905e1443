"""The prefix cache across requests: a request that begins with a finished sequence's tokens (the
next turn of a conversation) prefills only the rest, and its greedy tokens and logprobs equal
those of an engine without the cache — with n > 1, after evictions, and across a weight update,
which drops every entry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.inference.engine import Engine
from asyncrl.inference.prefill_plan import prefill_groups
from asyncrl.inference.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
SYSTEM = [60 + i % 20 for i in range(40)]  # a long shared head, like a system prompt


@pytest.fixture
def engines(tiny_model_dir: Path) -> Iterator[tuple[Engine, Engine]]:
    """(with the cache, without it), on one model: a weight update reaches both."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    cached = Engine(model, tokenizer, max_num_seqs=3, max_model_len=256, prefix_caching=True)
    plain = Engine(model, tokenizer, max_num_seqs=3, max_model_len=256)
    yield cached, plain
    cached.shutdown()
    plain.shutdown()


def complete(engine: Engine, prompt: list[int], n: int = 1) -> list:
    return engine.submit(prompt, GREEDY, n=n).done.result(timeout=60)


def assert_same(cached: list, plain: list) -> None:
    for with_cache, without in zip(cached, plain, strict=True):
        assert with_cache.token_ids == without.token_ids
        assert with_cache.logprobs == pytest.approx(without.logprobs, abs=1e-5)


def test_the_next_turn_prefills_only_its_new_tokens_and_generates_the_same(
    engines: tuple[Engine, Engine],
) -> None:
    cached, plain = engines
    history = [*SYSTEM, 81, 82, 83]
    in_cache = 0  # tokens of `history` whose keys and values the cache holds
    for turn in range(3):
        before = cached.stats.prefill_tokens
        [reply] = complete(cached, history)
        assert_same([reply], complete(plain, history))
        assert cached.stats.prefill_tokens - before == len(history) - in_cache
        # all but the reply's last token, whose keys and values were never computed
        in_cache = len(history) + len(reply.token_ids) - 1
        history = [*history, *reply.token_ids, 90 + turn, 91]  # the user's next message


def test_n_completions_from_a_cached_prefix_equal_the_engine_without_it(
    engines: tuple[Engine, Engine],
) -> None:
    cached, plain = engines
    complete(cached, [*SYSTEM, 81])
    before = cached.prefix_cache.hit_tokens  # type: ignore[union-attr]
    prompt = [*SYSTEM, 84, 85, 86]
    assert_same(complete(cached, prompt, n=3), complete(plain, prompt, n=3))
    assert cached.prefix_cache.hit_tokens - before == len(SYSTEM)  # type: ignore[union-attr]


def test_entries_are_evicted_for_running_sequences_and_results_stay_the_same(
    engines: tuple[Engine, Engine],
) -> None:
    cached, plain = engines
    prompts = [[*SYSTEM[: 10 + 5 * i], 100 + i] for i in range(6)]
    for prompt in prompts:  # 3 slots: each new request needs an entry's slot or its prefix
        assert_same(complete(cached, prompt), complete(plain, prompt))
    assert len(cached.prefix_cache.entries) <= 3  # type: ignore[union-attr]
    assert_same(complete(cached, prompts[0], n=3), complete(plain, prompts[0], n=3))


def test_a_weight_update_drops_every_entry(engines: tuple[Engine, Engine]) -> None:
    cached, plain = engines
    prompt = [*SYSTEM, 81]
    [reply] = complete(cached, prompt)
    assert cached.prefix_cache.entries  # type: ignore[union-attr]

    def update() -> None:
        with torch.no_grad():
            for parameter in cached.model.parameters():
                parameter.mul_(1.05)
        cached.weight_version = plain.weight_version = 1
        cached.forget_prefixes()  # as ServedModel does on every install

    cached.run_exclusive(update, timeout=60)
    assert not cached.prefix_cache.entries  # type: ignore[union-attr]
    follow_up = prompt + reply.token_ids + [90]
    before = cached.stats.prefill_tokens
    assert_same(complete(cached, follow_up), complete(plain, follow_up))
    assert cached.stats.prefill_tokens - before == len(follow_up)  # nothing stale reused


def test_a_sleep_frees_the_cached_slots(engines: tuple[Engine, Engine]) -> None:
    cached, _ = engines
    complete(cached, SYSTEM)
    assert cached.sleep() > 0  # raises if a slot were still held
    cached.wake()
    assert complete(cached, SYSTEM)[0].token_ids


def test_prefill_passes_never_write_past_the_cache() -> None:
    class Row:
        def __init__(self, cached: int, prefill_len: int) -> None:
            self.cached, self.prefill_len = cached, prefill_len

    rows = [Row(0, 200), Row(180, 10), Row(0, 30), Row(100, 90)]
    groups = prefill_groups(rows, max_len=256)  # type: ignore[arg-type]
    assert [[rows.index(r) for r in g] for g in groups] == [[0], [1, 2], [3]]
    for group in groups:
        assert max(r.cached for r in group) + max(r.prefill_len for r in group) <= 256
