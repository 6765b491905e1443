"""A model scorer's process: `python -m asyncrl.envs.model_rewards.scorer_worker '<json spec>'`.

It loads one scorer (a reward model, or a user's plugin from its import path and args), says
`{"ready": true}` (or `{"ready": false, "error": …}` when loading failed), then answers batches:
`{"items": [ScoreItem, …]}` in, `{"scores": [float | null, …], "tokens": n}` out, or
`{"error": traceback}` when the scorer raised. One JSON line each, on private descriptors
(`reward_worker.private_channels`: neither `print` nor a subprocess reaches them); nothing is
unpickled. The model's memory and CPU threads are this process's, not the orchestrator's.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from asyncrl.config.model_rewards import PluginTermConfig, RewardModelTermConfig
from asyncrl.envs.model_rewards.items import ScoreItem
from asyncrl.envs.reward_worker import private_channels

Scorer = Callable[[list[ScoreItem]], list[Any]]


def load_plugin(config: PluginTermConfig) -> Scorer:
    """The user's scorer: `factory(**args)` from `module:factory`."""
    module_name, _, attribute = config.import_path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ValueError(
            f"plugin `{config.import_path}`: cannot import {module_name} ({error})"
        ) from None
    factory = getattr(module, attribute, None)
    if factory is None:
        raise ValueError(f"plugin `{config.import_path}`: {module_name} has no `{attribute}`")
    scorer = factory(**config.args)
    if not callable(scorer):
        raise ValueError(
            f"plugin `{config.import_path}` returned {type(scorer).__name__}, not a scorer"
        )
    return scorer  # type: ignore[no-any-return]


def load_scorer(spec: dict[str, Any]) -> Scorer:
    if spec["type"] == "reward_model":
        from asyncrl.envs.model_rewards.reward_model import SequenceClassifierScorer

        return SequenceClassifierScorer(RewardModelTermConfig(**spec))
    return load_plugin(PluginTermConfig(**spec))


def as_score(value: Any) -> float | None:
    """A finite float, or None (the pool counts it unparseable)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def answer(scorer: Scorer, batch: dict[str, Any]) -> dict[str, Any]:
    items = [ScoreItem.from_json(fields) for fields in batch["items"]]
    tokens_before = getattr(scorer, "tokens", 0)
    try:
        scores = list(scorer(items))
        if len(scores) != len(items):
            raise ValueError(f"the scorer gave {len(scores)} scores for {len(items)} items")
    except Exception:  # the scorer's code: its failure costs this batch only
        return {"error": traceback.format_exc()[-4000:]}
    tokens = getattr(scorer, "tokens", 0) - tokens_before  # a reward model counts what it read
    return {"scores": [as_score(value) for value in scores], "tokens": tokens}


def main() -> None:
    tasks, channel = private_channels()
    spec = json.loads(sys.argv[1])
    os.environ.setdefault("OMP_NUM_THREADS", str(spec.get("threads") or 1))

    def say(message: dict[str, Any]) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    try:
        scorer = load_scorer(spec)
    except Exception:  # a wrong path or plugin: the pool reports it as a configuration error
        say({"ready": False, "error": traceback.format_exc()[-4000:]})
        return
    say({"ready": True})
    for line in tasks:
        say(answer(scorer, json.loads(line)))


if __name__ == "__main__":
    main()
