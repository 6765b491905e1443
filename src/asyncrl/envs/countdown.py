"""`countdown`: reach a target using each given number once with + − × ÷.

Problems are built by combining the numbers with random operations, so each has a solution.
Reward: 1 when the completion's expression (inside the last `<answer>…</answer>`, else its last
line, up to any `=`) uses exactly the given numbers and equals the target.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from fractions import Fraction

from asyncrl.envs.answers import ExpressionError, evaluate
from asyncrl.envs.base import Example, RewardFunction, Split, split_of

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def candidate_expression(completion: str) -> str:
    """The expression inside the last <answer> tag, else the last line; before any `=`."""
    tagged = ANSWER_TAG.findall(completion)
    if tagged:
        text = tagged[-1]
    else:
        lines = completion.strip().splitlines()
        text = lines[-1] if lines else ""
    return text.split("=")[0]


def check(expression: str, numbers: list[int], target: int) -> bool:
    try:
        value, used = evaluate(expression)
    except ExpressionError:
        return False
    return Counter(used) == Counter(numbers) and value == Fraction(target)


class CountdownEnv:
    name = "countdown"

    def __init__(self, seed: int = 0, count: int = 3, max_number: int = 20) -> None:
        self.seed, self.count, self.max_number = seed, count, max_number
        self.rubric = [RewardFunction("correct", self.correct)]

    def _problem(self, rng: random.Random) -> tuple[list[int], int] | None:
        numbers = [rng.randint(1, self.max_number) for _ in range(self.count)]
        expression = str(numbers[0])
        for number in numbers[1:]:
            expression = f"({expression} {rng.choice('+-*/')} {number})"
        value, _ = evaluate(expression)
        if value.denominator != 1 or value < 0:
            return None
        return numbers, int(value)

    def examples(self, split: Split, count: int) -> list[Example]:
        rng = random.Random(f"countdown:{self.seed}:{split}")
        examples: list[Example] = []
        while len(examples) < count:
            problem = self._problem(rng)
            if problem is None:
                continue
            numbers, target = problem
            if split_of(f"{sorted(numbers)}={target}") != split:
                continue
            prompt = (
                f"Using the numbers {numbers}, each exactly once, and + - * /, write an "
                f"expression equal to {target}. Answer as <answer>expression</answer>."
            )
            info = {"numbers": numbers, "target": target}
            messages = [{"role": "user", "content": prompt}]
            examples.append(Example(len(examples), messages, str(target), self.name, info))
        return examples

    def correct(self, completion: str, example: Example) -> float:
        expression = candidate_expression(completion)
        return float(check(expression, example.info["numbers"], example.info["target"]))


def load_environment(**kwargs: object) -> CountdownEnv:
    return CountdownEnv(**kwargs)  # type: ignore[arg-type]
