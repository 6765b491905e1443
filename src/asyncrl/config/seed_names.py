"""The seeds' key names (Surogate / prime-rl configs), accepted at load time: one table that
says which asyncrl key each one sets, so a config written for those systems loads, while
asyncrl's own models, `--help` and the reference list each setting once, under one name.

A seed name and its asyncrl key given together must agree. A seed key that has nothing to set
in asyncrl is accepted at its seed default (so the file loads) and refused otherwise, with the
reason and the key to use instead — never silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncrl.log import get_logger

logger = get_logger(__name__)

# section -> seed name -> the asyncrl key it sets (dotted within the section)
SEED_NAMES: dict[str, dict[str, str]] = {
    "trainer": {
        "gpus": "world_size",
        "transport_type": "rollout_transport.type",
    },
}


def _empty(value: Any) -> bool:
    return value in ([], None)


def _filesystem_block(value: Any) -> bool:
    """The seeds' weight-broadcast block at its `type` (filesystem), whatever its NCCL-only keys
    (`host`, `port`, `timeout`) say: they do nothing under filesystem in the seeds either."""
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    return value is None or (
        isinstance(value, dict) and value.get("type", "filesystem") == "filesystem"
    )


# section -> seed key -> (whether a value of it is one that sets nothing, why it sets nothing)
SEED_KEYS_WITHOUT_EFFECT: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "trainer": {
        "datasets": (_empty, "GRPO data comes from the orchestrator; leave `datasets` empty"),
    },
    "orchestrator": {
        "weight_broadcast": (
            _filesystem_block,
            "the orchestrator only loads the weights the trainer publishes: how they travel is "
            "`trainer.weight_broadcast` (and the servers' `weight_broadcast_type`, which "
            "`asyncrl rl` sets from it)",
        ),
    },
}


def _get(data: Any, dotted: str) -> Any:
    """The value at `dotted`, through dicts and sections given as models alike; None if unset."""
    for part in dotted.split("."):
        if hasattr(data, "model_dump"):
            data = data.model_dump(exclude_unset=True)
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of `data` with `dotted` set (sections copied on the way, never mutated)."""
    head, _, rest = dotted.partition(".")
    if not rest:
        return {**data, head: value}
    inner = data.get(head)
    inner = inner.model_dump(exclude_unset=True) if hasattr(inner, "model_dump") else inner
    return {**data, head: _set(dict(inner or {}), rest, value)}


def apply_seed_names(section: str, data: Any) -> Any:
    """`data` (one section's raw keys) with every seed name moved to the key it sets."""
    if not isinstance(data, dict):
        return data
    for seed, target in SEED_NAMES.get(section, {}).items():
        if seed not in data:
            continue
        value, data = data[seed], {k: v for k, v in data.items() if k != seed}
        existing = _get(data, target)
        if existing is not None and existing != value:
            raise ValueError(
                f"`{seed}` ({value}) disagrees with `{target}` ({existing}): `{seed}` is the "
                f"seeds' name for `{target}`; set one of them"
            )
        logger.debug("config: `%s` (the seeds' name) sets `%s`", seed, target)
        data = _set(data, target, value)
    for seed, (sets_nothing, reason) in SEED_KEYS_WITHOUT_EFFECT.get(section, {}).items():
        if seed not in data:
            continue
        if not sets_nothing(data[seed]):
            raise ValueError(f"`{seed}` has no effect in asyncrl: {reason}")
        data = {k: v for k, v in data.items() if k != seed}
    return data
