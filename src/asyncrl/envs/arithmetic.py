"""`arithmetic`: compute a + b, a − b or a × b; reward 1 when the last number in the completion
is the result."""

from __future__ import annotations

import random

from asyncrl.envs.answers import last_number
from asyncrl.envs.base import Example, RewardFunction, Split, split_of

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticEnv:
    name = "arithmetic"

    def __init__(self, seed: int = 0, max_value: int = 100, operations: str = "+-*") -> None:
        if not set(operations) <= set(OPERATIONS) or not operations:
            raise ValueError(f"operations must be drawn from {''.join(OPERATIONS)}")
        self.seed, self.max_value, self.operations = seed, max_value, operations
        self.rubric = [RewardFunction("correct", self.correct)]

    def examples(self, split: Split, count: int) -> list[Example]:
        rng = random.Random(f"arithmetic:{self.seed}:{split}")
        examples: list[Example] = []
        while len(examples) < count:
            a, b = rng.randint(0, self.max_value), rng.randint(0, self.max_value)
            op = rng.choice(self.operations)
            question = f"{a} {op} {b}"
            if split_of(question) != split:
                continue
            prompt = [{"role": "user", "content": f"{question} ="}]
            answer = str(OPERATIONS[op](a, b))
            info = {"question": question}
            examples.append(Example(len(examples), prompt, answer, self.name, info))
        return examples

    def correct(self, completion: str, example: Example) -> float:
        return float(last_number(completion) == example.answer)


def load_environment(**kwargs: object) -> ArithmeticEnv:
    return ArithmeticEnv(**kwargs)  # type: ignore[arg-type]
