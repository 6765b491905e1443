"""`guess-number`: find a hidden number in a range, told "higher" or "lower" after each guess.

A multi-turn game a tiny model can learn on a CPU: bisecting the range solves any problem in
⌈log2(width)⌉ + 1 guesses, so the reward pays for solving, and more for solving in fewer turns.
The episode is stateless: the guesses so far are in the conversation.
"""

from __future__ import annotations

import random
import re

from asyncrl.envs.base import Example, Messages, RewardFunction, Split, split_of
from asyncrl.envs.multi_turn import Reply

NUMBER = re.compile(r"-?\d+")


def parse_guess(text: str) -> int | None:
    match = NUMBER.search(text)
    return int(match.group()) if match else None


class GuessNumberEnv:
    name = "guess-number"

    def __init__(
        self, seed: int = 0, min_width: int = 8, max_width: int = 32, max_turns: int = 8
    ) -> None:
        if not 2 <= min_width <= max_width:
            raise ValueError(f"need 2 <= min_width <= max_width, got {min_width}, {max_width}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.seed = seed
        self.min_width = min_width
        self.max_width = max_width
        self.max_turns = max_turns
        self.rubric = [
            RewardFunction("solved", self.solved),
            RewardFunction("valid_guesses", self.valid_guesses, weight=0.2),
        ]

    def examples(self, split: Split, count: int) -> list[Example]:
        rng = random.Random(f"guess-number:{self.seed}:{split}")
        examples: list[Example] = []
        while len(examples) < count:
            low = rng.randint(1, 50)
            high = low + rng.randint(self.min_width, self.max_width) - 1
            secret = rng.randint(low, high)
            if split_of(f"{low}:{high}:{secret}") != split:
                continue
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
        """A bisecting episode, for the supervised warm-up (`asyncrl sft`)."""
        low, high, secret = example.info["low"], example.info["high"], int(example.answer)
        messages = list(example.prompt)
        for _ in range(self.max_turns):
            guess = (low + high) // 2
            messages.append({"role": "assistant", "content": str(guess)})
            if guess == secret:
                break
            reply = self.respond(messages, example)
            messages.extend(reply.messages)
            low, high = (guess + 1, high) if secret > guess else (low, guess - 1)
        return messages


def load_environment(**kwargs: object) -> GuessNumberEnv:
    return GuessNumberEnv(**kwargs)  # type: ignore[arg-type]
