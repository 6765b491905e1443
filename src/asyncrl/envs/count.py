"""`count`: count from one number to another; answers from a few tokens to a few hundred.

The prompt is `a..b` and the answer `a a+1 … b`, spaces between. The count of numbers is drawn
log-uniformly from `min_count` to `max_count`, so most answers are short and a few are long
(with the default 2..80 and three-digit numbers, from 7 to about 320 characters; the character
tokenizer makes that as many tokens): the long tail that, in reasoning RL, leaves a
synchronous trainer waiting for its slowest completion and pads every other one to its length.
Each step is easy (add one, carry) but a small model slips at carries and stops early or late,
so RL has room to improve on a warm-up. The reward is the share of numbers in their place,
over the longer of the answer and the completion.
"""

from __future__ import annotations

import math
import random

from asyncrl.envs.base import Example, RewardFunction, Split, split_of


def counted(start: int, count: int) -> str:
    return " ".join(str(number) for number in range(start, start + count))


def numbers_in_place(completion: str, answer: str) -> float:
    """Share of positions where the completion has the answer's number, over the longer."""
    got, wanted = completion.split(), answer.split()
    if not got and not wanted:
        return 1.0
    matched = sum(1 for mine, theirs in zip(got, wanted, strict=False) if mine == theirs)
    return matched / max(len(got), len(wanted))


class CountEnv:
    name = "count"

    def __init__(
        self, seed: int = 0, min_count: int = 2, max_count: int = 80, max_start: int = 899
    ) -> None:
        if not 1 <= min_count <= max_count:
            raise ValueError(f"need 1 <= min_count <= max_count, got {min_count}, {max_count}")
        if max_start < 0:
            raise ValueError(f"max_start must be >= 0, got {max_start}")
        self.seed = seed
        self.min_count, self.max_count, self.max_start = min_count, max_count, max_start
        self.rubric = [RewardFunction("numbers_in_place", self.reward)]

    def draw_count(self, rng: random.Random) -> int:
        """Log-uniform over min_count..max_count: many short answers, a long tail."""
        low, high = math.log(self.min_count), math.log(self.max_count + 1)
        return min(self.max_count, int(math.exp(rng.uniform(low, high))))

    def examples(self, split: Split, count: int) -> list[Example]:
        rng = random.Random(f"count:{self.seed}:{split}")
        examples: list[Example] = []
        while len(examples) < count:
            start = rng.randint(0, self.max_start)
            numbers = self.draw_count(rng)
            prompt = f"{start}..{start + numbers - 1}"
            if split_of(prompt) != split:
                continue
            examples.append(
                Example(
                    example_id=len(examples),
                    prompt=[{"role": "user", "content": prompt}],
                    answer=counted(start, numbers),
                    task=self.name,
                    info={"start": start, "count": numbers},
                )
            )
        return examples

    def reward(self, completion: str, example: Example) -> float:
        return numbers_in_place(completion, example.answer)


def load_environment(**kwargs: object) -> CountEnv:
    return CountEnv(**kwargs)  # type: ignore[arg-type]
