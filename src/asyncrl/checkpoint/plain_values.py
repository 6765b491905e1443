"""The non-tensor part of a checkpoint (optimizer hyper-parameters, scheduler, step, RNG) as JSON.

A state dict mixes tensors with plain values: `param_groups` (floats, tuples, booleans, lists of
parameter names), a scheduler's counters. torch would pickle the plain ones; here they are
split off (`split_tensors`), written as JSON that can only ever decode to numbers, strings,
booleans, None, lists, tuples and dicts, and merged back after the tensors are loaded
(`merge`). A tuple is kept a tuple (`{"__tuple__": [...]}`), and a non-finite float
round-trips (Python's JSON writes NaN and Infinity).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import torch

from asyncrl.config.base import ConfigError

TUPLE = "__tuple__"
PLAIN_TYPES = (str, int, float, bool, type(None))


class CheckpointRefused(ConfigError):
    """A checkpoint this version will not load: an older pickled format, or a file that is not
    what it claims. The message names the file and what to do; like a config error, a
    restart would meet it again, so a supervisor does not retry it."""


def split_tensors(state: dict[str, Any], path: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensors, plain): two nested dicts with `state`'s shape, the first holding only its
    tensors, the second everything else. Raises `ValueError` naming the key of a value that
    is neither (or a tensor inside a list)."""
    tensors: dict[str, Any] = {}
    plain: dict[str, Any] = {}
    for key, value in state.items():
        where = f"{path}.{key}" if path else str(key)
        if not isinstance(key, str):
            raise ValueError(f"checkpoint key {where!r} is not a string")
        if isinstance(value, torch.Tensor):
            tensors[key] = value
        elif isinstance(value, dict) and value:
            inner_tensors, inner_plain = split_tensors(value, where)
            if inner_tensors:
                tensors[key] = inner_tensors
            if inner_plain:
                plain[key] = inner_plain
        else:
            check_plain(value, where)
            plain[key] = value
    return tensors, plain


def check_plain(value: Any, where: str) -> None:
    if isinstance(value, PLAIN_TYPES):
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_plain(item, f"{where}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"checkpoint key {where}.{key!r} is not a string")
            check_plain(item, f"{where}.{key}")
        return
    raise ValueError(f"checkpoint value {where} is a {type(value).__name__}: not savable as JSON")


def _encode(value: Any) -> Any:
    if isinstance(value, tuple):
        return {TUPLE: [_encode(item) for item in value]}
    if isinstance(value, list):
        return [_encode(item) for item in value]
    if isinstance(value, dict):
        return {key: _encode(item) for key, item in value.items()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(item) for item in value]
    if isinstance(value, dict):
        if set(value) == {TUPLE} and isinstance(value[TUPLE], list):
            return tuple(_decode(item) for item in value[TUPLE])
        return {key: _decode(item) for key, item in value.items()}
    return value


def dumps(value: dict[str, Any]) -> bytes:
    check_plain(value, "")
    return json.dumps(_encode(value), indent=1).encode()


def loads(data: bytes, source: str) -> dict[str, Any]:
    """Decode what `dumps` wrote; `source` names the file in the error."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise CheckpointRefused(f"{source} is not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise CheckpointRefused(f"{source} holds a {type(value).__name__}, not an object")
    decoded: dict[str, Any] = _decode(value)
    return decoded


def rng_to_text(state: torch.Tensor) -> str:
    """torch's CPU RNG state (a uint8 tensor) as base64 text."""
    return base64.b64encode(state.contiguous().numpy().tobytes()).decode()


def rng_from_text(text: Any, source: str) -> torch.Tensor:
    if not isinstance(text, str):
        raise CheckpointRefused(f"{source}: torch_rng is not base64 text")
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError as error:
        raise CheckpointRefused(f"{source}: torch_rng is not base64 ({error})") from None
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()
