"""`asyncrl score`: what a run's reward gives a few completions, seen before any training.

A reward that never pays, or pays everything, wastes a run; this shows the prompts a run would
send, the answer and extra columns the reward receives, and the reward of each completion with
its terms. The completions are scored by the same isolated reward workers a run uses, under a
run's limits (timeout, memory, CPU time: `orchestrator.reward_*`'s defaults) and without the
run's secrets, so a reward module a worker cannot import, or a reward that raises, hangs or
runs away, shows up here too. Dataset text and completions are shown with control characters
escaped (`\x1b`, `\u202e`…): a line of data cannot move the cursor, recolour or rewrite the
terminal, or reorder what is shown.
"""

from __future__ import annotations

import asyncio
import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from asyncrl.config.env import rubric_only
from asyncrl.config.score import ScoreConfig
from asyncrl.envs.base import Example
from asyncrl.envs.jsonl_file import read_jsonl
from asyncrl.envs.registry import EnvironmentLoadError, load_environment
from asyncrl.envs.reward_pool import RewardPool, RewardResult
from asyncrl.run_secret import withhold
from asyncrl.user_code import pass_through

SHOWN = 240  # characters of a prompt or completion shown


@dataclass(frozen=True)
class Scored:
    example: Example
    completion: str
    result: RewardResult


def filled(text: str, example: Example) -> str:
    """`text` with `{answer}` and `{<column>}` (the example's other columns) filled in."""
    for key, value in {**example.info, "answer": example.answer}.items():
        text = text.replace(f"{{{key}}}", str(value))
    return text


def completions_for(config: ScoreConfig, examples: list[Example]) -> list[tuple[int, str]]:
    """(example position, completion text) for every completion to score."""
    pairs = [
        (index, filled(text, example))
        for index, example in enumerate(examples)
        for text in config.completions
    ]
    if config.completions_file:
        path = Path(config.completions_file)
        for number, record in read_jsonl(path):
            if not isinstance(record.get("completion"), str):
                raise EnvironmentLoadError(f"{path}:{number}: needs a string `completion`")
            position = record.get("example")
            if position is not None and not isinstance(position, int):
                raise EnvironmentLoadError(f"{path}:{number}: `example` must be a whole number")
            targets = range(len(examples)) if position is None else [position]
            if any(not 0 <= t < len(examples) for t in targets):
                raise EnvironmentLoadError(
                    f"{path}:{number}: `example` {position} is not among the "
                    f"{len(examples)} examples (num_examples)"
                )
            pairs += [(target, record["completion"]) for target in targets]
    return pairs


async def score_all(config: ScoreConfig) -> list[Scored]:
    env_config = rubric_only(config.env, "`asyncrl score` scores the environment's own rubric")
    if env_config.address:
        raise EnvironmentLoadError(
            "`asyncrl score` loads the environment here; for an env-server, run it there"
        )
    withhold()  # the worker runs the user's reward: no key of ours in what it inherits
    pass_through(*config.env_passthrough)
    env = load_environment(env_config.id, env_config.args)
    try:
        examples = env.examples(config.split, config.num_examples)
    except ValueError as error:
        raise EnvironmentLoadError(f"environment `{env_config.id}`: {error}") from error
    pool = RewardPool(env_config.id, env_config.args, env.rubric, num_workers=1,
                      timeout=config.timeout, memory_limit=config.memory_limit,
                      cpu_limit=config.cpu_limit)  # fmt: skip
    await pool.start()
    try:
        return [
            Scored(examples[index], text, await pool.score(text, examples[index]))
            for index, text in completions_for(config, examples)
        ]
    finally:
        await pool.close()


def shown(text: str) -> str:
    """`text` safe for a terminal: newlines as ⏎, and every other control character (C0, DEL,
    C1: escape sequences), format character (bidirectional overrides, zero-width) and line or
    paragraph separator as its Python escape."""
    return "".join("⏎" if c == "\n" else _escaped(c) for c in text)


def _escaped(character: str) -> str:
    if unicodedata.category(character) in ("Cc", "Cf", "Zl", "Zp"):
        return character.encode("unicode_escape").decode("ascii")
    return character


def _short(text: str) -> str:
    flat = shown(text)
    return flat if len(flat) <= SHOWN else flat[: SHOWN - 1] + "…"


def _quoted(text: str) -> str:
    """A completion, quoted as Python would (its `repr` escapes what `shown` does, and more)."""
    flat = text.replace("\n", "⏎")
    return repr(flat if len(flat) <= SHOWN else flat[: SHOWN - 1] + "…")


def report(scored: list[Scored]) -> str:
    lines: list[str] = []
    seen: set[int] = set()
    for item in scored:
        example = item.example
        if id(example) not in seen:
            seen.add(id(example))
            prompt = example.prompt[-1]["content"] if example.prompt else ""
            lines += [
                "",
                f"example {shown(str(example.example_id))} ({shown(str(example.task))})",
                f"  prompt:  {_short(prompt)}",
                f"  answer:  {_short(example.answer)}",
            ]
            if example.info:
                lines.append(f"  info:    {_short(json.dumps(example.info))}")
        result = item.result
        terms = ", ".join(f"{shown(name)} {value:.3g}" for name, value in result.values.items())
        trouble = ""
        if result.lost:
            trouble = f"  [no answer from the reward: {result.lost}]"
        elif result.failed:
            trouble = f"  [raised or not finite: {shown(', '.join(result.failed))}]"
        lines.append(
            f"  reward {result.reward:.3f} ({terms}) ← {_quoted(item.completion)}{trouble}"
        )
    rewards = [item.result.reward for item in scored]
    if rewards:
        lines += ["", f"{len(rewards)} completions: reward min {min(rewards):.3f}, "
                  f"mean {sum(rewards) / len(rewards):.3f}, max {max(rewards):.3f}"]  # fmt: skip
    return "\n".join(lines)


def run_score(config: ScoreConfig) -> None:
    print(report(asyncio.run(score_all(config))))
