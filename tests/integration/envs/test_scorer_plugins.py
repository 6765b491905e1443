"""A user's scorer plugin (`type: plugin`, `module:factory`) in a process of its own: it scores
batches, and when it raises, hangs, dies or gives no number it costs those rollouts, counted by
kind, never the run; the next batch is scored by a fresh process."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.model_rewards import PluginTermConfig
from asyncrl.envs.model_rewards.items import ScoreItem
from asyncrl.envs.model_rewards.scorer_process import ScorerProcess
from asyncrl.envs.model_rewards.stats import Judged, TermFigures

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PLUGIN = """
import math, os, time

def by_length(scale=1.0):
    return lambda items: [scale * len(item.completion_text) for item in items]

def raises():
    def scorer(items):
        raise RuntimeError("the scorer broke")
    return scorer

def hangs_on(word):
    def scorer(items):
        if any(item.completion_text == word for item in items):
            time.sleep(3600)
        return [1.0 for _ in items]
    return scorer

def dies_once(marker):
    def scorer(items):
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)
        return [2.0 for _ in items]
    return scorer

def no_number_for(word):
    values = {word: None, "nan": math.nan}
    return lambda items: [values.get(item.completion_text, 1.0) for item in items]

def wrong_count():
    return lambda items: [1.0]

def will_not_load():
    raise ValueError("no such model")
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The module `my_scorers`, importable by the scorer's process."""
    (tmp_path / "my_scorers.py").write_text(PLUGIN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    return "my_scorers"


def item(completion: str) -> ScoreItem:
    return ScoreItem([{"role": "user", "content": "abc"}], completion, "cba", "reverse-text")


async def batches(
    config: PluginTermConfig, groups: list[list[str]]
) -> tuple[list[list[Judged]], TermFigures]:
    """Each group scored as one `gather`, one group after the other."""
    term = ScorerProcess(config)
    await term.start()
    try:
        results = []
        for group in groups:
            results.append(list(await asyncio.gather(*(term.score(item(c)) for c in group))))
        return results, term.stats.take()
    finally:
        await term.close()


def test_a_plugin_scores_each_group_in_one_batch(plugin: str) -> None:
    config = PluginTermConfig(import_path=f"{plugin}:by_length", args={"scale": 0.5})
    results, figures = asyncio.run(batches(config, [["ab", "abcd"], ["", "abcdef", "x"]]))
    assert [[j.value for j in group] for group in results] == [[1.0, 2.0], [0.0, 3.0, 0.5]]
    assert (figures.requests, figures.batch_items, figures.scored) == (2, 5, 5)


def test_a_plugin_that_raises_costs_its_batch_and_the_next_batch_is_scored(plugin: str) -> None:
    config = PluginTermConfig(import_path=f"{plugin}:raises")
    results, figures = asyncio.run(batches(config, [["a", "b"], ["c"]]))
    assert [j.failure for group in results for j in group] == ["error"] * 3
    assert figures.failures["error"] == 3


def test_a_plugin_that_hangs_is_killed_after_its_timeout_and_replaced(plugin: str) -> None:
    config = PluginTermConfig(import_path=f"{plugin}:hangs_on", args={"word": "stuck"}, timeout=2)
    started = time.monotonic()
    results, figures = asyncio.run(batches(config, [["ok", "stuck"], ["ok"]]))
    assert [j.failure for j in results[0]] == ["timeout", "timeout"]
    assert results[1] == [Judged(1.0)]  # a fresh process scored the next group
    assert figures.failures["timeout"] == 2
    assert time.monotonic() - started < 60


def test_a_plugin_process_that_dies_costs_its_batch_and_is_restarted(
    plugin: str, tmp_path: Path
) -> None:
    marker = str(tmp_path / "died")
    config = PluginTermConfig(import_path=f"{plugin}:dies_once", args={"marker": marker})
    results, figures = asyncio.run(batches(config, [["a", "b"], ["c"]]))
    assert [j.failure for j in results[0]] == ["unavailable", "unavailable"]
    assert results[1] == [Judged(2.0)]
    assert figures.failures["unavailable"] == 2


def test_a_score_that_is_not_a_finite_number_costs_only_its_rollout(plugin: str) -> None:
    config = PluginTermConfig(import_path=f"{plugin}:no_number_for", args={"word": "huh"})
    results, figures = asyncio.run(batches(config, [["a", "huh", "nan", "b"]]))
    assert [j.failure for j in results[0]] == [None, "unparseable", "unparseable", None]
    assert (figures.scored, figures.failures["unparseable"]) == (2, 2)


def test_a_plugin_giving_the_wrong_number_of_scores_costs_its_batch(plugin: str) -> None:
    results, _ = asyncio.run(
        batches(PluginTermConfig(import_path=f"{plugin}:wrong_count"), [["a", "b"]])
    )
    assert [j.failure for j in results[0]] == ["error", "error"]


@pytest.mark.parametrize(
    ("import_path", "reason"),
    [("my_scorers:will_not_load", "no such model"), ("my_scorers:missing", "has no `missing`"),
     ("not_a_module:x", "cannot import not_a_module")],
)  # fmt: skip
def test_a_plugin_that_cannot_load_stops_start_up_naming_why(
    plugin: str, import_path: str, reason: str
) -> None:
    with pytest.raises(ConfigError, match=reason):
        asyncio.run(batches(PluginTermConfig(name="mine", import_path=import_path), []))
