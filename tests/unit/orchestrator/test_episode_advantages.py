"""Advantages of multi-turn episodes: the outcome advantage on every token, or (process
supervision) per-turn rewards, each turn's step ending at its last token — checked against a
hand-worked group."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from asyncrl.config.base import ConfigError
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs import load_environment
from asyncrl.envs.reward_pool import RewardResult
from asyncrl.orchestrator.episode import Episode, episode_advantages, episode_tokens
from asyncrl.orchestrator.rollout import Completion
from asyncrl.orchestrator.startup_checks import refuse_environments_without_step_rewards


def episode(*parts: int) -> Episode:
    """Model turns and environment messages alternating, by their number of tokens."""
    played = Episode(messages=[], prompt_ids=[1, 2])
    for index, n in enumerate(parts):
        if index % 2 == 0:
            turn = Completion(0, "turn", [7] * n, [-0.1] * n, "stop", [1, 2], None)
            played.add_model_turn(turn, version=0)
        else:
            played.add_environment([{"role": "user", "content": "hint"}], [9] * n)
    return played


def config(advantage: str) -> OrchestratorConfig:
    return OrchestratorConfig(
        model={"name": "m"}, env=[{"id": "calculator"}], advantage={"type": advantage}
    )


def test_turn_rewards_reach_the_tokens_of_their_turn_and_the_turns_before() -> None:
    episodes = [episode(3, 2, 2), episode(2, 2, 3)]
    scored = [
        RewardResult(1.0, {}, steps=[(0, 1.0), (1, 1.0)]),
        RewardResult(0.0, {}, steps=[(0, 0.0), (1, 1.0), (5, 1.0)]),  # turn 5: no such turn
    ]
    # the four step rewards 1, 1, 0, 1: mean 3/4, standard deviation √3/4
    high, low = (1 - 0.75) / (math.sqrt(3) / 4), (0 - 0.75) / (math.sqrt(3) / 4)
    first, second = episode_advantages(episodes, scored, config("process"))
    assert first == pytest.approx([2 * high] * 3 + [high] * 2 + [high] * 2, abs=1e-5)
    assert second == pytest.approx([low + high] * 2 + [high] * 2 + [high] * 3, abs=1e-5)


def test_outcome_advantages_cover_every_token_of_the_episode() -> None:
    episodes = [episode(3, 2, 2), episode(2, 2, 3), episode(1)]
    scored = [RewardResult(r, {}) for r in (1.0, 0.0, 0.5)]
    advantages = episode_advantages(episodes, scored, config("default"))
    assert advantages == [[0.5] * 7, [-0.5] * 7, [0.0]]


def test_process_advantages_are_refused_for_an_environment_that_gives_no_step_rewards(
    tiny_model_dir: Path,
) -> None:
    """calculator judges its turns; guess-number (multi-turn) and reverse-text (single-turn)
    judge nothing, so they would train on zero advantages."""
    calculator, guess, reverse = (
        load_environment(name, {}) for name in ("calculator", "guess-number", "reverse-text")
    )
    refuse_environments_without_step_rewards([calculator], ["calculator"])
    with pytest.raises(ConfigError, match="guess-number gives none"):
        refuse_environments_without_step_rewards([calculator, guess], ["calc", "guess-number"])
    with pytest.raises(ConfigError, match="reverse-text gives none"):
        refuse_environments_without_step_rewards([reverse], ["reverse-text"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)  # multi-turn: turns can be appended
    assert episode_tokens([calculator, guess], ["calculator", "guess-number"], tokenizer)
    assert episode_tokens([reverse], ["reverse-text"], tokenizer) is None
