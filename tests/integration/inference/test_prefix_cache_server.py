"""The prefix cache behind the real server: `inference.enable_prefix_caching: true` makes a
conversation's next turn reuse the previous turn's keys and values (counted on /metrics), with
the tokens and logprobs the same request gets once `/reset_prefix_cache` has emptied it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from asyncrl.launch.inference_process import inference_server

pytestmark = pytest.mark.integration


def hit_tokens(url: str) -> int:
    page = httpx.get(f"{url}/metrics").text
    return int(re.search(r"asyncrl:prefix_cache_hit_tokens_total\{[^}]*\} (\d+)", page)[1])  # type: ignore[index]


def turn(url: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": "m", "messages": messages, "max_tokens": 8, "temperature": 0.0,
            "logprobs": True}  # fmt: skip
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    response.raise_for_status()
    choice: dict[str, Any] = response.json()["choices"][0]
    return choice


def test_the_next_turn_reuses_the_previous_one(tiny_model_dir: Path) -> None:
    flags = ["--enable_prefix_caching", "true", "--served_model_name", "m"]
    with inference_server(tiny_model_dir, *flags) as url:
        messages = [{"role": "user", "content": "reverse: hello there"}]
        first = turn(url, messages)
        messages += [{"role": "assistant", "content": first["message"]["content"]},
                     {"role": "user", "content": "and again"}]  # fmt: skip
        before = hit_tokens(url)
        cached = turn(url, messages)
        assert hit_tokens(url) > before
        assert httpx.post(f"{url}/reset_prefix_cache").json() == {"reset": True}
        before = hit_tokens(url)
        fresh = turn(url, messages)
        assert hit_tokens(url) == before  # nothing left to reuse
    assert cached["message"]["content"] == fresh["message"]["content"]
    pairs = zip(cached["logprobs"]["content"], fresh["logprobs"]["content"], strict=True)
    for with_cache, without in pairs:
        assert with_cache["logprob"] == pytest.approx(without["logprob"], abs=1e-5)
