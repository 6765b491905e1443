from __future__ import annotations

import pytest

from asyncrl.envs import load_environment
from asyncrl.envs.registry import EnvironmentLoadError
from asyncrl.envs.reverse_text import ReverseTextEnv, lcs_length, lcs_ratio, split_of


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
