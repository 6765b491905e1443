from __future__ import annotations

import random

import pytest

from asyncrl.envs import load_environment
from asyncrl.envs.registry import EnvironmentLoadError
from asyncrl.envs.reverse_text import (
    ReverseTextEnv,
    lcs_length,
    lcs_length_reference,
    lcs_ratio,
    split_of,
)


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ("", "", 0),
        ("abc", "", 0),
        ("abc", "abc", 3),
        ("abcde", "ace", 3),  # a, c, e
        ("abcbdab", "bdcaba", 4),  # the textbook example (e.g. "bcba")
        ("abc", "cba", 1),
        ("olleh", "hello", 2),  # "ll"
    ],
)
def test_lcs_length_hand_worked(first: str, second: str, expected: int) -> None:
    assert lcs_length(first, second) == expected
    assert lcs_length(second, first) == expected


def test_lcs_ratio_hand_worked() -> None:
    assert lcs_ratio("olleh", "olleh") == 1.0
    assert lcs_ratio("", "") == 1.0
    assert lcs_ratio("xyz", "olleh") == 0.0
    assert lcs_ratio("olle", "olleh") == pytest.approx(2 * 4 / 9)
    assert lcs_ratio("ace", "abcde") == pytest.approx(2 * 3 / 8)
    assert lcs_ratio("", "abc") == 0.0


def test_examples_are_deterministic_and_reversed() -> None:
    env = ReverseTextEnv(seed=7)
    first, again = env.examples("train", 50), env.examples("train", 50)
    assert first == again
    for example in first:
        text = example.info["text"]
        assert 5 <= len(text) <= 20
        assert text == text.strip() and "  " not in text
        assert set(text) <= set("abcdefghijklmnopqrstuvwxyz ")
        assert example.answer == text[::-1]
        assert example.prompt == [{"role": "user", "content": text}]
        assert env.reward(example.answer, example) == 1.0
    assert ReverseTextEnv(seed=8).examples("train", 50) != first


def test_train_and_eval_splits_never_share_a_prompt() -> None:
    env = ReverseTextEnv()
    train = {example.info["text"] for example in env.examples("train", 3000)}
    held_out = {example.info["text"] for example in env.examples("eval", 400)}
    assert not train & held_out
    assert all(split_of(text) == "eval" for text in held_out)


def test_system_prompt_and_lengths_are_arguments() -> None:
    env = load_environment(
        "reverse-text", {"min_length": 3, "max_length": 4, "system_prompt": "Rev."}
    )
    example = env.examples("eval", 1)[0]
    assert example.prompt[0] == {"role": "system", "content": "Rev."}
    assert 3 <= len(example.info["text"]) <= 4


def test_unknown_environment_and_bad_args_are_clear_errors() -> None:
    with pytest.raises(EnvironmentLoadError, match="module `no_such_env` is not installed"):
        load_environment("someone/no-such-env")
    with pytest.raises(EnvironmentLoadError, match="bad args"):
        load_environment("reverse-text", {"colour": "red"})


def test_bit_parallel_lcs_equals_the_dynamic_programme_on_random_strings() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        first = "".join(rng.choice("ab c") for _ in range(rng.randint(0, 60)))
        second = "".join(rng.choice("abc d") for _ in range(rng.randint(0, 60)))
        assert lcs_length(first, second) == lcs_length_reference(first, second), (first, second)
    long = "".join(rng.choice("abcdefgh ") for _ in range(300))
    assert lcs_length(long, long[::-1]) == lcs_length_reference(long, long[::-1])


def test_log_uniform_lengths_give_a_long_tail_within_the_bounds() -> None:
    env = ReverseTextEnv(max_length=256, lengths="log-uniform")
    lengths = sorted(len(example.answer) for example in env.examples("train", 2000))
    assert lengths[0] >= 5 and lengths[-1] <= 256
    median, tail = lengths[len(lengths) // 2], lengths[int(0.95 * len(lengths))]
    assert median < 60 < 150 < tail  # most short, a few long
    with pytest.raises(ValueError, match="lengths"):
        ReverseTextEnv(lengths="normal")  # type: ignore[arg-type]
