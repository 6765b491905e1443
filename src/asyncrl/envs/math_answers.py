"""`math`: answer in a final `\\boxed{}`. Problems from a JSONL file (`data_path`: fields
`question` / `problem` / `input`, and `answer`) or, asked for with `generate: true`, generated
arithmetic expressions (never silently: a run without either is refused).

Checking uses math-verify when it is installed (symbolic equivalence: 1/2 = 0.5 = \\frac{1}{2});
otherwise a normalised exact match (spaces, `$`, a trailing `.0` removed).
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

from asyncrl.envs.answers import boxed, evaluate
from asyncrl.envs.base import Example, RewardFunction, Split, split_of
from asyncrl.envs.jsonl_file import read_jsonl

SUFFIX = "\nPut the final answer in \\boxed{}."
HAVE_MATH_VERIFY = importlib.util.find_spec("math_verify") is not None


def normalise(answer: str) -> str:
    text = answer.strip().strip("$").replace(" ", "")
    return text[:-2] if text.endswith(".0") else text


def same_answer(predicted: str, gold: str) -> bool:
    if HAVE_MATH_VERIFY:
        from math_verify import parse, verify

        return bool(verify(parse(f"${gold}$"), parse(f"${predicted}$")))
    return normalise(predicted) == normalise(gold)


def read_problems(path: Path) -> list[tuple[str, str]]:
    problems = []
    for number, record in read_jsonl(path):
        question = record.get("question") or record.get("problem") or record.get("input")
        if question is None or "answer" not in record:
            raise ValueError(f"{path}:{number}: needs `question` and `answer`")
        problems.append((str(question), str(record["answer"])))
    return problems


class MathEnv:
    name = "math"

    def __init__(
        self, data_path: str | None = None, seed: int = 0, depth: int = 2, generate: bool = False
    ) -> None:
        if bool(data_path) == generate:
            raise ValueError(
                "math: give `data_path` (a JSONL of question/answer lines: your problems) or "
                "`generate: true` (generated arithmetic expressions, for trying the pipeline), "
                "not both and not neither"
            )
        self.problems = read_problems(Path(data_path)) if data_path else None
        self.seed, self.depth = seed, depth
        self.rubric = [RewardFunction("boxed_correct", self.correct)]

    def _generated(self, rng: random.Random) -> tuple[str, str]:
        expression = str(rng.randint(1, 9))
        for _ in range(self.depth):
            expression = f"({expression} {rng.choice('+-*')} {rng.randint(1, 9)})"
        value, _ = evaluate(expression)
        return f"Compute {expression[1:-1]}.", str(value)

    def examples(self, split: Split, count: int) -> list[Example]:
        rng = random.Random(f"math:{self.seed}:{split}")
        pool = [p for p in self.problems or [] if split_of(p[0]) == split]
        if self.problems is not None and not pool:
            raise ValueError(f"math: no {split} problems in the data file")
        examples = []
        while len(examples) < count:
            question, answer = rng.choice(pool) if pool else self._generated(rng)
            if not pool and split_of(question) != split:
                continue
            messages = [{"role": "user", "content": question + SUFFIX}]
            examples.append(Example(len(examples), messages, answer, self.name))
        return examples

    def correct(self, completion: str, example: Example) -> float:
        predicted = boxed(completion)
        return float(predicted is not None and same_answer(predicted, example.answer))


def load_environment(**kwargs: object) -> MathEnv:
    return MathEnv(**kwargs)  # type: ignore[arg-type]
