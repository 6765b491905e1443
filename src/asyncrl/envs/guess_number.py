"""`guess-number`: find a hidden number in a range, told "higher" or "lower" after each guess.

A multi-turn game a tiny model can learn on a CPU: bisecting the range solves any problem in
⌈log2(width)⌉ + 1 guesses, so the reward pays for solving, and more for solving in fewer turns.
The episode is stateless: the guesses so far are in the conversation.

The warm-up plays either bisection or `consistent` guesses: any number the hints still allow,
drawn at random. A model warmed up on the second solves most games but slowly, and RL has to
find that aiming at the middle pays (a fixed range, `max_low: 1`, makes that a tiny model's
task: no arithmetic on the bounds). Held out are the ranges; with one range, the games drawn.
Every prompt of a range is the same, so a run deduplicates examples by `answer` too
(`orchestrator.buffer.hash_keys`).
"""

from __future__ import annotations

import random
import re
from typing import Literal

from asyncrl.envs.base import Example, Messages, RewardFunction, Split, split_of
from asyncrl.envs.multi_turn import Reply

NUMBER = re.compile(r"-?\d+")


def parse_guess(text: str) -> int | None:
    match = NUMBER.search(text)
    return int(match.group()) if match else None


class GuessNumberEnv:
    name = "guess-number"

    def __init__(
        self, seed: int = 0, min_width: int = 8, max_width: int = 32, max_turns: int = 8,
        max_low: int = 50, warmup: Literal["bisect", "consistent"] = "bisect",
    ) -> None:  # fmt: skip
        """The range starts anywhere in 1..`max_low` and spans `min_width`..`max_width`."""
        if not 2 <= min_width <= max_width:
            raise ValueError(f"need 2 <= min_width <= max_width, got {min_width}, {max_width}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if max_low < 1:
            raise ValueError(f"max_low must be >= 1, got {max_low}")
        if warmup not in ("bisect", "consistent"):
            raise ValueError(f"warmup must be 'bisect' or 'consistent', got {warmup!r}")
        self.seed = seed
        self.min_width = min_width
        self.max_width = max_width
        self.max_turns = max_turns
        self.max_low = max_low
        self.warmup = warmup
        self.one_range = max_low == 1 and min_width == max_width
        self.rubric = [
            RewardFunction("solved", self.solved),
            RewardFunction("valid_guesses", self.valid_guesses, weight=0.2),
        ]

    def examples(self, split: Split, count: int) -> list[Example]:
        rng = random.Random(f"guess-number:{self.seed}:{split}")
        examples: list[Example] = []
        while len(examples) < count:
            low = rng.randint(1, self.max_low)
            high = low + rng.randint(self.min_width, self.max_width) - 1
            secret = rng.randint(low, high)
            if not self.one_range and split_of(f"{low}:{high}") != split:
                continue  # ranges are held out; with one range, each split draws its own games
            prompt = (
                f"I am thinking of a number from {low} to {high}. Guess it: answer with a "
                "number only. I will say higher or lower."
            )
            examples.append(
                Example(
                    example_id=len(examples),
                    prompt=[{"role": "user", "content": prompt}],
                    answer=str(secret),
                    task=self.name,
                    info={"low": low, "high": high},
                )
            )
        return examples

    def respond(self, messages: Messages, example: Example) -> Reply:
        guess = parse_guess(messages[-1]["content"])
        secret, low, high = int(example.answer), example.info["low"], example.info["high"]
        if guess == secret:
            return Reply(done=True)
        if guess is None or not low <= guess <= high:
            hint = f"Guess from {low} to {high}."  # short: every token counts against seq_len
        else:
            hint = "higher" if secret > guess else "lower"
        return Reply([{"role": "user", "content": hint}])

    def solved(self, messages: Messages, example: Example) -> float:
        """1 for a first-guess hit, less per extra guess, 0 if never found."""
        guesses = [parse_guess(m["content"]) for m in messages if m["role"] == "assistant"]
        if not guesses or guesses[-1] != int(example.answer):
            return 0.0
        return 1.0 - (len(guesses) - 1) / (2 * self.max_turns)

    def valid_guesses(self, messages: Messages, example: Example) -> float:
        """The fraction of guesses that are a number in the range."""
        low, high = example.info["low"], example.info["high"]
        guesses = [parse_guess(m["content"]) for m in messages if m["role"] == "assistant"]
        valid = [g is not None and low <= g <= high for g in guesses]
        return sum(valid) / len(valid) if valid else 0.0

    def demonstration(self, example: Example) -> Messages:
        """An episode for the supervised warm-up (`asyncrl sft`): bisecting, or consistent
        guesses drawn with a seed of the example's own, so the warm-up data is reproducible."""
        low, high, secret = example.info["low"], example.info["high"], int(example.answer)
        rng = random.Random(f"guess-number:{self.seed}:{low}:{high}:{secret}")
        messages = list(example.prompt)
        for _ in range(self.max_turns):
            guess = (low + high) // 2 if self.warmup == "bisect" else rng.randint(low, high)
            messages.append({"role": "assistant", "content": str(guess)})
            if guess == secret:
                break
            reply = self.respond(messages, example)
            messages.extend(reply.messages)
            low, high = (guess + 1, high) if secret > guess else (low, guess - 1)
        return messages


def load_environment(**kwargs: object) -> GuessNumberEnv:
    return GuessNumberEnv(**kwargs)  # type: ignore[arg-type]
