from __future__ import annotations

import json
from collections import Counter

import pytest

from asyncrl.config.orchestrator import BufferConfig
from asyncrl.envs.base import Example
from asyncrl.orchestrator.buffer import Buffer


class ListEnv:
    """A small environment over a fixed list of prompts (duplicates included on purpose)."""

    def __init__(self, name: str, prompts: list[str]) -> None:
        self.name = name
        self.prompts = prompts
        self.rubric: list = []

    def examples(self, split: str, count: int) -> list[Example]:
        return [
            Example(i, [{"role": "user", "content": p}], p[::-1], self.name)
            for i, p in enumerate(self.prompts[:count])
        ]


def make(config: BufferConfig, *envs: ListEnv) -> Buffer:

    return Buffer(list(envs), config, seed=0, pool_size=100)


def test_duplicates_are_dropped_by_hash_keys() -> None:
    env = ListEnv("a", ["x", "y", "x", "z"])
    assert len(make(BufferConfig(), env).examples[0]) == 3  # task + prompt: "x" twice
    by_id = make(BufferConfig(hash_keys=["example_id"]), env)
    assert len(by_id.examples[0]) == 4


def test_an_example_is_drawn_as_often_as_copies_of_it_came() -> None:
    """Deduplication keeps one example per key and the environment's distribution: "x" came
    twice in four, so it is half of every pass; without `weight_duplicates`, a third."""
    env = ListEnv("a", ["x", "y", "x", "z"])
    weighted = make(BufferConfig(), env)
    assert Counter(text(weighted.draw()) for _ in range(4)) == {"x": 2, "y": 1, "z": 1}
    assert Counter(text(weighted.draw()) for _ in range(4000))["x"] == 2000  # 1000 passes
    uniform = make(BufferConfig(weight_duplicates=False), env)
    assert Counter(text(uniform.draw()) for _ in range(3)) == {"x": 1, "y": 1, "z": 1}


def test_a_duplicated_example_in_the_easy_pool_is_not_drawn_at_all() -> None:
    buffer = make(BufferConfig(easy_threshold=0.9), ListEnv("a", ["x", "y", "x"]))
    drawn = next(d for d in iter(buffer.draw, None) if text(d) == "x")
    buffer.record(drawn, [1.0, 1.0])
    assert {text(buffer.draw()) for _ in range(20)} == {"y"}


def test_a_pool_mostly_dropped_as_duplicates_is_reported_with_the_key_to_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A game whose prompt hides its answer: one prompt for every example."""
    make(BufferConfig(), ListEnv("a", ["x", "y", "x", "z"]))
    assert not caplog.records
    make(BufferConfig(), ListEnv("game", ["same"] * 10))
    assert "9 of 10 game examples are duplicates" in caplog.text
    assert "orchestrator.buffer.hash_keys" in caplog.text
    caplog.clear()
    make(BufferConfig(hash_keys=["prompt", "answer"]), ListEnv("game", ["same"] * 10))
    assert not caplog.records  # told: games that look alike are alike


def test_every_example_comes_once_per_pass() -> None:
    buffer = make(BufferConfig(), ListEnv("a", ["p", "q", "r"]))
    first_pass = Counter(buffer.draw().example.answer for _ in range(3))
    assert first_pass == {"p": 1, "q": 1, "r": 1}


def test_env_ratios_weight_the_environments() -> None:
    buffer = make(BufferConfig(env_ratios=[3, 1]), ListEnv("a", ["a1", "a2"]), ListEnv("b", ["b"]))
    counts = Counter(buffer.draw().env_index for _ in range(4000))
    assert counts[0] / 4000 == pytest.approx(0.75, abs=0.03)


def text(drawn: object) -> str:
    return drawn.example.prompt[0]["content"]  # type: ignore[attr-defined]


def test_easy_and_hard_pools_stop_sampling_and_promote_back_on_load() -> None:
    config = BufferConfig(easy_threshold=0.9, hard_threshold=0.1, easy_fraction=1.0)
    buffer = make(config, ListEnv("a", ["easy", "hard", "normal"]))
    seen = {}
    for _ in range(3):
        drawn = buffer.draw()
        seen[text(drawn)] = drawn
    buffer.record(seen["easy"], [1.0, 0.95])
    buffer.record(seen["hard"], [0.0, 0.05])
    buffer.record(seen["normal"], [0.5, 0.5])
    assert {text(buffer.draw()) for _ in range(10)} == {"normal"}

    saved = json.loads(json.dumps(buffer.state()))  # plain JSON round trip
    restored = make(config, ListEnv("a", ["easy", "hard", "normal"]))
    restored.load_state(saved)  # easy_fraction 1.0 promotes every easy problem back
    assert not restored.easy and len(restored.hard) == 1
    assert {text(restored.draw()) for _ in range(10)} == {"easy", "normal"}


class TokenIdEnv:
    """Pre-tokenized examples (a JSONL of `input_token_ids`): no messages, only token ids."""

    name = "ids"

    def __init__(self, prompts: list[list[int]]) -> None:
        self.prompts = prompts
        self.rubric: list = []

    def examples(self, split: str, count: int) -> list[Example]:
        return [Example(i, [], "", self.name, prompt_token_ids=ids)
                for i, ids in enumerate(self.prompts[:count])]  # fmt: skip


def test_pre_tokenized_examples_are_told_apart_by_their_token_ids() -> None:
    env = TokenIdEnv([[1, 2, 3], [4, 5], [1, 2, 3], [6]])
    assert len(make(BufferConfig(), env).examples[0]) == 3  # only the repeated ids are one
