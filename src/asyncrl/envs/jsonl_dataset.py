"""`jsonl`: prompts and answers from a JSONL file with async-grpo's fields.

Each line holds `input` (the prompt text) or `input_token_ids` (a prompt already tokenized with
the chat template applied; sent to the server as token ids), and `answer`. Reward: exact match
of the stripped completion (`reward: exact`), the LCS ratio (`lcs`), or a `\\boxed{}` answer
(`math`). Lines are split train/eval by the same hash rule as the generated environments.
"""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl.envs.answers import boxed
from asyncrl.envs.base import Example, RewardFunction, Split, split_of
from asyncrl.envs.jsonl_file import read_jsonl
from asyncrl.envs.math_answers import same_answer
from asyncrl.envs.reverse_text import lcs_ratio


class JsonlDataset:
    def __init__(self, path: str, reward: str = "exact", system_prompt: str | None = None) -> None:
        self.name = f"jsonl:{Path(path).name}"
        self.records = self._read(Path(path))
        self.system_prompt = system_prompt
        scorers = {"exact": self.exact, "lcs": self.lcs, "math": self.math}
        if reward not in scorers:
            raise ValueError(f"reward must be one of {sorted(scorers)}, got {reward!r}")
        self.rubric = [RewardFunction(reward, scorers[reward])]

    @staticmethod
    def _read(path: Path) -> list[dict]:
        records = []
        for number, record in read_jsonl(path):
            if "answer" not in record or not ("input" in record or "input_token_ids" in record):
                raise ValueError(
                    f"{path}:{number}: needs `answer` and `input` or `input_token_ids`"
                )
            records.append(record)
        return records

    def examples(self, split: Split, count: int) -> list[Example]:
        """`count` examples, cycling through the split's records."""
        chosen = [r for r in self.records if split_of(json.dumps(r, sort_keys=True)) == split]
        if not chosen:
            raise ValueError(f"{self.name}: no {split} records (one in eight lines is held out)")
        return [self._example(index % len(chosen), chosen[index % len(chosen)])
                for index in range(count)]  # fmt: skip

    def _example(self, index: int, record: dict) -> Example:
        messages = [{"role": "user", "content": str(record.get("input", ""))}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return Example(
            example_id=index,
            prompt=messages,
            answer=str(record["answer"]),
            task=self.name,
            prompt_token_ids=record.get("input_token_ids"),
        )

    def exact(self, completion: str, example: Example) -> float:
        return float(completion.strip() == example.answer.strip())

    def lcs(self, completion: str, example: Example) -> float:
        return lcs_ratio(completion, example.answer)

    def math(self, completion: str, example: Example) -> float:
        predicted = boxed(completion)
        return float(predicted is not None and same_answer(predicted, example.answer))


def load_environment(**kwargs: object) -> JsonlDataset:
    return JsonlDataset(**kwargs)  # type: ignore[arg-type]
