"""The prompt buffer: which example to roll out next, and what a finished group says about it.

- Examples come from each environment's train split, deduplicated by `hash_keys`: one
  example per key, the one the easy and hard pools track.
- `env_ratios` weight the choice of environment; within one, examples cycle in a fresh random
  order each pass, each as many times a pass as copies of it came (`weight_duplicates`): the
  draws follow the environment's own distribution. Drawn once each, a generator's small items,
  which repeat, would be drawn far less often than the environment makes them (reasoning-gym
  `products` of 1-2 digits: half of its items are one-digit questions, 89 distinct ones; once
  each, they were 3 % of the draws, and asyncrl trained on harder problems than TRL given the
  same task and than the held-out set it was scored on).
- After a group is scored: with `online_difficulty_filtering`, a group whose advantages are all
  0 (rewards all equal: all 0, all 1 or the same partial credit) teaches nothing and is dropped
  by the orchestrator (`orchestrator/dropped/no_signal`); a problem whose mean reward is at
  least `easy_threshold` moves to the easy pool, at most `hard_threshold` to the hard pool, and
  is no longer sampled. On start, `easy_fraction` / `hard_fraction` of those pools are promoted
  back to normal.
- `state()` / `load_state()` make it checkpointable (plain JSON-able data).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asyncrl.config.orchestrator import BufferConfig
from asyncrl.envs.base import Environment, Example
from asyncrl.log import get_logger

logger = get_logger(__name__)


@dataclass(frozen=True)
class Drawn:
    env_index: int
    example: Example


def example_key(example: Example, keys: Sequence[str]) -> str:
    """The hash `hash_keys` deduplicate by. `prompt` is what the model is prompted with: the
    messages, and the token ids or plain text where the example has them (a JSONL of token ids
    has no messages: by the messages alone every line was one example)."""
    prompt: Any = example.prompt
    if example.prompt_token_ids is not None or example.prompt_text is not None:
        prompt = [example.prompt, example.prompt_token_ids, example.prompt_text]
    fields = {
        "task": example.task, "prompt": prompt, "answer": example.answer,
        "example_id": example.example_id, "info": example.info,
    }  # fmt: skip
    payload = json.dumps([fields.get(key) for key in keys], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


class Buffer:
    def __init__(
        self, envs: Sequence[Environment], config: BufferConfig, seed: int, pool_size: int
    ) -> None:
        self.config = config
        self.rng = random.Random(config.seed if config.seed is not None else seed)
        self.examples: list[list[Example]] = []
        self.copies: list[list[int]] = []  # per environment, per example: draws in a pass
        for env in envs:
            unique: dict[str, Example] = {}
            copies: Counter[str] = Counter()
            drawn = env.examples("train", pool_size)
            for example in drawn:
                key = example_key(example, config.hash_keys)
                unique.setdefault(key, example)
                copies[key] += 1
            self.examples.append(list(unique.values()))
            self.copies.append([copies[key] if config.weight_duplicates else 1 for key in unique])
            if len(unique) < len(drawn) / 2 and "answer" not in config.hash_keys:
                logger.warning(  # a game whose prompt hides its answer: one prompt, many games
                    "buffer: %d of %d %s examples are duplicates by %s (one kept per key); if "
                    "examples that look alike differ in what the environment hides, add "
                    "'answer' to orchestrator.buffer.hash_keys",
                    len(drawn) - len(unique), len(drawn), env.name, config.hash_keys,
                )  # fmt: skip
        ratios = config.env_ratios or [1.0] * len(envs)
        if len(ratios) != len(envs):
            raise ValueError(f"buffer.env_ratios has {len(ratios)} entries for {len(envs)} envs")
        self.ratios = ratios
        self.easy: set[tuple[int, str]] = set()
        self.hard: set[tuple[int, str]] = set()
        self._order: list[list[int]] = [[] for _ in envs]

    def draw(self) -> Drawn:
        env_index = self.rng.choices(range(len(self.examples)), weights=self.ratios)[0]
        pool, copies = self.examples[env_index], self.copies[env_index]
        for _ in range(2 * sum(copies) + 1):
            if not self._order[env_index]:
                order = [index for index, count in enumerate(copies) for _ in range(count)]
                self.rng.shuffle(order)
                self._order[env_index] = order
            example = pool[self._order[env_index].pop()]
            key = (env_index, example_key(example, self.config.hash_keys))
            if key not in self.easy and key not in self.hard:
                return Drawn(env_index, example)
        raise RuntimeError(f"environment {env_index}: every example is in the easy or hard pool")

    def record(self, drawn: Drawn, rewards: Sequence[float]) -> None:
        """Update the pools from a scored group."""
        key = (drawn.env_index, example_key(drawn.example, self.config.hash_keys))
        mean = sum(rewards) / len(rewards)
        if self.config.easy_threshold is not None and mean >= self.config.easy_threshold:
            self.easy.add(key)
        elif self.config.hard_threshold is not None and mean <= self.config.hard_threshold:
            self.hard.add(key)

    def state(self) -> dict[str, Any]:
        return {
            "rng": _rng_state(self.rng),
            "easy": sorted([list(k) for k in self.easy]),
            "hard": sorted([list(k) for k in self.hard]),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.rng.setstate(_rng_from(state["rng"]))
        self.easy = {(int(i), str(k)) for i, k in state["easy"]}
        self.hard = {(int(i), str(k)) for i, k in state["hard"]}
        self._promote(self.easy, self.config.easy_fraction)
        self._promote(self.hard, self.config.hard_fraction)

    def _promote(self, pool: set[tuple[int, str]], fraction: float) -> None:
        chosen = self.rng.sample(sorted(pool), round(fraction * len(pool)))
        pool.difference_update(chosen)


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from(state: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
