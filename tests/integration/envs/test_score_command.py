"""Issue 60 (8): `asyncrl score` scores as a run does, under a run's reward limits, and shows
dataset text with its control characters escaped, never sent to the terminal raw."""

from __future__ import annotations

import asyncio
import os
import sys
import unicodedata
from pathlib import Path

import pytest

from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.config.score import ScoreConfig
from asyncrl.envs.score_command import report, score_all, shown

pytestmark = pytest.mark.integration

HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x9b31m\u202eevil\u2028\x00\r"  # clear, title, C1, bidi, …

MODULE = f"""
import resource
from asyncrl.envs.base import Example, RewardFunction

def memory_gib(completion, example):
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return -1.0 if soft == resource.RLIM_INFINITY else soft / 2**30

def cpu_limited(completion, example):
    soft, _ = resource.getrlimit(resource.RLIMIT_CPU)
    return float(soft != resource.RLIM_INFINITY)

class LimitsEnv:
    name = "limits"
    rubric = [RewardFunction("memory_gib", memory_gib, weight=0.0),
              RewardFunction("cpu_limited", cpu_limited)]

    def examples(self, split, count):
        text = {HOSTILE!r}
        return [Example(example_id=0, prompt=[{{"role": "user", "content": "prompt" + text}}],
                        answer="answer" + text, task="task" + text, info={{"note": text}})]

def load_environment():
    return LimitsEnv()
"""


@pytest.fixture
def env_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "limits_env.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    return "someone/limits-env"


def test_score_runs_rewards_under_a_runs_limits(env_id: str) -> None:
    """It used to give its worker no memory and no CPU limit: a reward that runs away under a
    run (and scores 0 there) ran on unbounded here."""
    run = OrchestratorConfig.model_fields
    config = ScoreConfig(env={"id": env_id}, num_examples=1, completions=["x"])
    assert (config.timeout, config.memory_limit, config.cpu_limit) == (
        run["reward_timeout"].default,
        run["reward_memory_limit"].default,
        run["reward_cpu_limit"].default,
    )
    [scored] = asyncio.run(score_all(config))
    assert scored.result.values == {"memory_gib": run["reward_memory_limit"].default,
                                    "cpu_limited": 1.0}  # fmt: skip
    unbounded = config.model_copy(update={"memory_limit": None, "cpu_limit": None})
    [scored] = asyncio.run(score_all(unbounded))
    assert scored.result.values == {"memory_gib": -1.0, "cpu_limited": 0.0}


def test_score_shows_dataset_text_with_its_control_characters_escaped(env_id: str) -> None:
    config = ScoreConfig(env={"id": env_id}, num_examples=1, completions=["{answer}"])
    text = report(asyncio.run(score_all(config)))
    raw = [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]
    assert raw == [], raw
    assert "\\x1b[2J" in text and "\\u202eevil" in text and "\\x9b31m" in text
    for line in ("example 0 (task", "  prompt:  prompt", "  answer:  answer"):
        assert line in text


def test_shown_escapes_what_a_terminal_would_act_on() -> None:
    assert shown("a\nb") == "a⏎b"
    assert shown("ok: é, 中文, emoji 🙂") == "ok: é, 中文, emoji 🙂"
    assert shown(HOSTILE) == ("\\x1b[2J\\x1b]0;pwned\\x07\\x9b31m\\u202eevil\\u2028\\x00\\r")
