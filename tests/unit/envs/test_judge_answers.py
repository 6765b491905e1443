"""Reading a judge's answer: a number in its text, or verdict probabilities from its logprobs."""

from __future__ import annotations

import math
import re

import pytest

from asyncrl.envs.model_rewards.judge_answers import (
    first_token_alternatives,
    number_score,
    verdict_score,
)

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("7", 0.7), ("Score: 10/10", 1.0), ("I'd say 2.5, maybe 3", 0.25), ("0", 0.0)],
)
def test_the_first_number_is_mapped_from_the_scale(text: str, expected: float) -> None:
    assert number_score(text, NUMBER, (0.0, 10.0)) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "good", "11", "-1", "nan"])
def test_no_number_or_one_outside_the_scale_is_unparseable(text: str) -> None:
    assert number_score(text, NUMBER, (0.0, 10.0)) is None


def test_a_pattern_with_a_group_reads_the_group() -> None:
    pattern = re.compile(r"Rating: (\d)")
    assert number_score("1 of 3 steps... Rating: 4", pattern, (1.0, 5.0)) == pytest.approx(0.75)


def test_verdict_score_is_the_probability_weighted_value_over_verdicts_found() -> None:
    alternatives = [("Yes", math.log(0.6)), ("No", math.log(0.2)), ("Maybe", math.log(0.1))]
    score = verdict_score(alternatives, {"Yes": 1.0, "No": 0.0})
    assert score == pytest.approx(0.6 / 0.8)


def test_verdict_spellings_with_spaces_add_up_and_the_sampled_token_counts_once() -> None:
    # the sampled token comes first and again among the top alternatives
    alternatives = [(" Yes", math.log(0.3)), (" Yes", math.log(0.3)), ("Yes", math.log(0.1)),
                    (" No", math.log(0.4))]  # fmt: skip
    assert verdict_score(alternatives, {"Yes": 1.0, "No": 0.0}) == pytest.approx(0.4 / 0.8)


def test_no_verdict_among_the_alternatives_is_unparseable() -> None:
    assert verdict_score([("Hmm", -0.1), ("Well", -2.0)], {"Yes": 1.0, "No": 0.0}) is None


def test_first_token_alternatives_read_a_chat_completion_choice() -> None:
    choice = {
        "message": {"content": "y3"},
        "logprobs": {"content": [
            {"token": "y", "logprob": -0.5, "top_logprobs": [
                {"token": "y", "logprob": -0.5}, {"token": "n", "logprob": -1.5}]},
            {"token": "3", "logprob": -0.1, "top_logprobs": []},
        ]},
    }  # fmt: skip
    assert first_token_alternatives(choice) == [("y", -0.5), ("y", -0.5), ("n", -1.5)]
    assert first_token_alternatives({"message": {"content": ""}, "logprobs": None}) == []
