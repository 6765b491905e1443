"""guess-number: hints, rewards, and a warm-up demonstration that bisects."""

from __future__ import annotations

import math

import pytest

from asyncrl.envs.base import Example, Messages
from asyncrl.envs.guess_number import GuessNumberEnv
from asyncrl.envs.multi_turn import Reply, is_multi_turn, reply_problems


def after_guesses(example: Example, *guesses: str) -> Messages:
    return [*example.prompt, *({"role": "assistant", "content": g} for g in guesses)]


def say(env: GuessNumberEnv, example: Example, guess: str) -> Reply:
    return env.respond(after_guesses(example, guess), example)


def test_it_hints_higher_or_lower_and_ends_on_the_secret() -> None:
    env = GuessNumberEnv(max_turns=6)
    example = env.examples("train", 1)[0]
    secret, low, high = int(example.answer), example.info["low"], example.info["high"]
    assert is_multi_turn(env) and low <= secret <= high
    assert say(env, example, str(secret)) == Reply(done=True)
    if secret > low:
        assert say(env, example, str(secret - 1)).messages == [
            {"role": "user", "content": "higher"}
        ]
    if secret < high:
        assert say(env, example, f"it is {secret + 1}").messages == [
            {"role": "user", "content": "lower"}
        ]
    for wrong in ["", "no idea", str(high + 1)]:
        reply = say(env, example, wrong)
        assert not reply.done and f"from {low} to {high}" in reply.messages[0]["content"]
        assert reply_problems(reply) is None


def test_rewards_pay_for_solving_and_less_for_each_extra_guess() -> None:
    env = GuessNumberEnv(max_turns=4)
    example = env.examples("eval", 1)[0]
    secret = int(example.answer)
    assert env.solved(after_guesses(example, str(secret)), example) == 1.0
    assert env.solved(after_guesses(example, "x", "y", str(secret)), example) == 1.0 - 2 / 8
    assert (
        env.solved(after_guesses(example, str(secret), "x"), example) == 0.0
    )  # the last guess counts
    assert env.valid_guesses(after_guesses(example, "x", str(secret)), example) == 0.5


def test_demonstrations_bisect_to_the_secret_within_the_bound() -> None:
    env = GuessNumberEnv(max_turns=8)
    for example in env.examples("train", 50):
        messages = env.demonstration(example)
        guesses = [m for m in messages if m["role"] == "assistant"]
        width = example.info["high"] - example.info["low"] + 1
        assert guesses[-1]["content"] == example.answer
        assert len(guesses) <= math.floor(math.log2(width)) + 1
        assert env.solved(messages, example) > 0.5


def test_train_and_eval_never_share_a_range() -> None:
    env = GuessNumberEnv()
    key = lambda e: (e.info["low"], e.info["high"])  # noqa: E731
    assert not {key(e) for e in env.examples("train", 300)} & {
        key(e) for e in env.examples("eval", 50)
    }


def test_with_one_range_each_split_draws_its_own_games() -> None:
    env = GuessNumberEnv(max_low=1, min_width=16, max_width=16)
    train, held_out = env.examples("train", 200), env.examples("eval", 200)
    assert (
        {e.answer for e in train} == {e.answer for e in held_out} == {str(n) for n in range(1, 17)}
    )
    assert [e.answer for e in train] != [e.answer for e in held_out]


def test_a_malformed_reply_is_named() -> None:
    assert "not a Reply" in reply_problems({"done": True})
    assert "role 'assistant'" in reply_problems(Reply([{"role": "assistant", "content": "x"}]))
    assert "no messages" in reply_problems(Reply([]))


def test_consistent_demonstrations_guess_only_what_the_hints_allow_and_are_reproducible() -> None:
    env = GuessNumberEnv(max_low=1, min_width=32, max_width=32, max_turns=32, warmup="consistent")
    examples = env.examples("train", 50)
    assert {(e.info["low"], e.info["high"]) for e in examples} == {(1, 32)}
    lengths = []
    for example in examples:
        messages = env.demonstration(example)
        assert messages == env.demonstration(example)
        low, high = 1, 32
        for guess, hint in zip(messages[1::2], [*messages[2::2], None], strict=True):
            number = int(guess["content"])
            assert low <= number <= high
            if hint is not None:
                low, high = (number + 1, high) if hint["content"] == "higher" else (low, number - 1)
        assert int(messages[-1]["content"]) == int(example.answer)
        lengths.append(len(messages[1::2]))
    assert max(lengths) > math.floor(math.log2(32)) + 1  # slower than bisecting, sometimes


def test_a_bad_warmup_name_is_refused() -> None:
    with pytest.raises(ValueError, match="warmup"):
        GuessNumberEnv(warmup="linear")  # type: ignore[arg-type]
