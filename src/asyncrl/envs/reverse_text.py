"""`reverse-text`: reverse a random lowercase string; reward is the LCS ratio."""

from __future__ import annotations

import math
import random
from typing import Literal

from asyncrl.envs.base import Example, RewardFunction, Split, split_of


def lcs_length(first: str, second: str) -> int:
    """Length of the longest common subsequence, bit-parallel (Hyyrö's formulation of
    Allison and Dix): one row of the dynamic programme is the bits of one integer, so a
    character of `first` costs a few big-integer operations instead of a pass over `second`.
    Two 256-character strings take about 0.2 ms instead of 20 ms; the result is the textbook
    programme's (`lcs_length_reference`, against which it is tested)."""
    if not first or not second:
        return 0
    positions: dict[str, int] = {}  # character -> bitmask of where it stands in `second`
    for index, character in enumerate(second):
        positions[character] = positions.get(character, 0) | (1 << index)
    everything = (1 << len(second)) - 1
    row = everything  # bit i set: the LCS so far does not use second[i]
    for character in first:
        matches = positions.get(character, 0)
        taken = row & matches
        row = ((row + taken) | (row - taken)) & everything
    return len(second) - row.bit_count()


def lcs_length_reference(first: str, second: str) -> int:
    """The textbook dynamic programme, one row at a time: the reference `lcs_length` is
    checked against."""
    previous = [0] * (len(second) + 1)
    for char_first in first:
        current = [0]
        for index, char_second in enumerate(second):
            if char_first == char_second:
                current.append(previous[index] + 1)
            else:
                current.append(max(previous[index + 1], current[index]))
        previous = current
    return previous[-1]


def lcs_ratio(completion: str, answer: str) -> float:
    """2·LCS / (|completion| + |answer|): 1.0 for an exact match, 0.0 when nothing is shared."""
    total = len(completion) + len(answer)
    if total == 0:
        return 1.0
    return 2.0 * lcs_length(completion, answer) / total


def random_text(
    rng: random.Random, min_length: int, max_length: int, log_uniform: bool = False
) -> str:
    """Lowercase letters with single spaces between words; never starts or ends with a space.
    The length is uniform over min..max, or with `log_uniform` uniform in its logarithm: most
    texts short, a long tail of long ones."""
    if log_uniform:
        low, high = math.log(min_length), math.log(max_length + 1)
        length = min(max_length, int(math.exp(rng.uniform(low, high))))
    else:
        length = rng.randint(min_length, max_length)
    characters: list[str] = []
    while len(characters) < length:
        can_space = characters and characters[-1] != " " and len(characters) < length - 1
        if can_space and rng.random() < 0.15:
            characters.append(" ")
        else:
            characters.append(chr(rng.randint(ord("a"), ord("z"))))
    return "".join(characters)


class ReverseTextEnv:
    name = "reverse-text"

    def __init__(
        self,
        seed: int = 0,
        min_length: int = 5,
        max_length: int = 20,
        system_prompt: str | None = None,
        lengths: Literal["uniform", "log-uniform"] = "uniform",
    ) -> None:
        """`lengths: log-uniform` with a large `max_length` is the generation-heavy workload:
        answers as long as their texts, most short and a few long."""
        if not 1 <= min_length <= max_length:
            raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")
        if lengths not in ("uniform", "log-uniform"):
            raise ValueError(f"lengths must be uniform or log-uniform, got {lengths!r}")
        self.seed = seed
        self.min_length = min_length
        self.max_length = max_length
        self.log_uniform = lengths == "log-uniform"
        self.system_prompt = system_prompt
        self.rubric = [RewardFunction("lcs_ratio", self.reward)]

    def examples(self, split: Split, count: int) -> list[Example]:
        rng = random.Random(f"reverse-text:{self.seed}:{split}")
        examples: list[Example] = []
        while len(examples) < count:
            text = random_text(rng, self.min_length, self.max_length, self.log_uniform)
            if split_of(text) != split:
                continue
            examples.append(
                Example(
                    example_id=len(examples),
                    prompt=self._messages(text),
                    answer=text[::-1],
                    task=self.name,
                    info={"text": text},
                )
            )
        return examples

    def reward(self, completion: str, example: Example) -> float:
        return lcs_ratio(completion, example.answer)

    def _messages(self, text: str) -> list[dict[str, str]]:
        user = [{"role": "user", "content": text}]
        if self.system_prompt:
            return [{"role": "system", "content": self.system_prompt}, *user]
        return user


def load_environment(**kwargs: object) -> ReverseTextEnv:
    return ReverseTextEnv(**kwargs)  # type: ignore[arg-type]
