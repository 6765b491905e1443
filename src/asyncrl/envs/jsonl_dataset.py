"""`jsonl`: your own prompts, answers and reward, from a JSONL file (docs/environments.md).

Each line holds the prompt (`input`, or the column `input_key` names; or `input_token_ids`, a
prompt already tokenized with the chat template applied and sent as token ids) and the answer
(`answer`, or `answer_key`). Every other column goes to the reward in `example.info`, so a
reward can read test cases, units or a difficulty without an environment of its own.

`reward`: exact match of the stripped completion (`exact`), the LCS ratio (`lcs`), a
`\\boxed{}` answer (`math`), or your function by import path (`my_rewards:score`, called as
`score(completion, example) -> float` in the isolated reward workers, like every reward, and
imported only there; the module must be importable: installed, or on PYTHONPATH). With your own
function the answer column is optional.

Held out: `eval_path` names a file of its own, used whole for evaluation while `path` is used
whole for training; without it one line in eight (by a hash of the line) is held out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncrl.config.import_path import function_at
from asyncrl.envs.answers import boxed
from asyncrl.envs.base import Example, RewardFunction, Split, split_of
from asyncrl.envs.jsonl_file import read_jsonl
from asyncrl.envs.math_answers import same_answer
from asyncrl.envs.prompt_ids import shape_problem
from asyncrl.envs.reverse_text import lcs_ratio


class JsonlDataset:
    def __init__(
        self,
        path: str,
        reward: str = "exact",
        system_prompt: str | None = None,
        eval_path: str | None = None,
        input_key: str = "input",
        answer_key: str = "answer",
    ) -> None:
        self.name = f"jsonl:{Path(path).name}"
        self.system_prompt = system_prompt
        self.input_key, self.answer_key = input_key, answer_key
        built_in: dict[str, Callable[[str, Example], float]] = {
            "exact": self.exact, "lcs": self.lcs, "math": self.math,
        }  # fmt: skip
        if reward in built_in:
            self.rubric = [RewardFunction(reward, built_in[reward])]
        elif ":" in reward:
            function = function_at(reward, key="reward")
            self.rubric = [RewardFunction(reward.rpartition(":")[2], function)]  # type: ignore[arg-type]
        else:
            raise ValueError(
                f"reward must be one of {sorted(built_in)} or a function's import path "
                f"(`module:function`), got {reward!r}"
            )
        needs_answer = reward in built_in
        self.records = self._read(Path(path), needs_answer)
        self.eval_records = self._read(Path(eval_path), needs_answer) if eval_path else None

    def _read(self, path: Path, needs_answer: bool) -> list[tuple[str, dict[str, Any]]]:
        """The file's records, each with its `path:line` (for `Example.source`). Token ids are
        checked for their shape here; against the tokenizer and `seq_len` by the orchestrator,
        which knows them (`orchestrator/example_checks.py`)."""
        records = []
        for number, record in read_jsonl(path):
            if self.input_key not in record and "input_token_ids" not in record:
                raise ValueError(f"{path}:{number}: needs `{self.input_key}` or `input_token_ids`")
            if needs_answer and self.answer_key not in record:
                raise ValueError(
                    f"{path}:{number}: needs `{self.answer_key}` (the reward compares with it)"
                )
            problem = "input_token_ids" in record and shape_problem(record["input_token_ids"])
            if problem:
                raise ValueError(f"{path}:{number}: {problem}")
            records.append((f"{path}:{number}", record))
        return records

    def examples(self, split: Split, count: int) -> list[Example]:
        """`count` examples, cycling through the split's records."""
        if self.eval_records is not None:
            chosen = self.eval_records if split == "eval" else self.records
        else:
            chosen = [
                (source, record)
                for source, record in self.records
                if split_of(json.dumps(record, sort_keys=True)) == split
            ]
        if not chosen:
            held_out = "the eval_path file" if self.eval_records is not None else "one line in 8"
            raise ValueError(f"{self.name}: no {split} records ({held_out} is held out)")
        return [self._example(index % len(chosen), *chosen[index % len(chosen)])
                for index in range(count)]  # fmt: skip

    def _example(self, index: int, source: str, record: dict[str, Any]) -> Example:
        messages = [{"role": "user", "content": str(record.get(self.input_key, ""))}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        own = {self.input_key, self.answer_key, "input_token_ids"}
        return Example(
            example_id=index,
            prompt=messages,
            answer=str(record.get(self.answer_key, "")),
            task=self.name,
            info={key: value for key, value in record.items() if key not in own},
            prompt_token_ids=record.get("input_token_ids"),
            source=source,
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
