"""Practice data for a tiny judge of reverse-text, built on this CPU (no model hub):
`python examples/judges/judge_data.py OUT.jsonl [COUNT]`, then `asyncrl sft` on it (jsonl env).

Each line is a judge prompt about one attempt at reversing a text, and the answer a judge
should give: a verdict, `y` or `n`, then a score 0-9 (`y9`, `n4`), so one judge serves both
ways a judge term reads an answer: `read: verdict` (the probability of `y` against `n` at the
first token) and `read: number` (the score in the text). Attempts are the right reversal, a
shuffled one, or random letters, so the answers vary. The tiny judge learns the
format quickly and the grading roughly; it stands in for a real judge model, whose path would
go in the `judge:` section instead.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from asyncrl.envs.reverse_text import lcs_ratio, random_text

# the judge terms' template (examples/judges/rl.yaml uses the same string)
JUDGE_PROMPT = "Reverse of {task}: {completion}\nRight (y/n), score 0-9?"


def attempt(rng: random.Random, text: str) -> str:
    answer = text[::-1]
    kind = rng.random()
    if kind < 0.4:
        return answer
    if kind < 0.7:
        return "".join(rng.sample(answer, len(answer)))
    return random_text(rng, 1, max(1, len(text)))


def judge_answer(completion: str, text: str) -> str:
    """The verdict (y: the exact reversal) then the score (9 × the LCS ratio, rounded)."""
    verdict = "y" if completion == text[::-1] else "n"
    return f"{verdict}{round(9 * lcs_ratio(completion, text[::-1]))}"


def judge_lines(count: int, seed: int = 0) -> list[dict[str, str]]:
    """`count` (input, answer) records."""
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        text = random_text(rng, 3, 10)
        completion = attempt(rng, text)
        prompt = JUDGE_PROMPT.format(task=text, completion=completion)
        lines.append({"input": prompt, "answer": judge_answer(completion, text)})
    return lines


def write_judge_data(path: Path, count: int, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in judge_lines(count, seed)))
    return path


if __name__ == "__main__":
    write_judge_data(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 4000)
