"""/pause modes as vLLM documents them: abort ends in-flight requests, wait drains them,
keep freezes them in place; requests that arrive while paused wait for /resume."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from asyncrl.launch.inference_process import inference_server

pytestmark = pytest.mark.integration

LONG = 900  # tokens: a few seconds of decoding for the tiny model on this CPU


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path) -> Iterator[str]:
    with inference_server(tiny_model_dir, "--max_model_len", "1024") as server:
        yield server


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def complete(url: str, max_tokens: int) -> dict[str, Any]:
    body = {"prompt": "go", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}  # fmt: skip
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def gauge(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return float(re.search(rf"^asyncrl:{name}\{{[^}}]*\}} (\S+)$", text, re.M).group(1))


def wait_until_running(url: str, future: Future[Any]) -> None:
    deadline = time.monotonic() + 30
    while gauge(url, "num_requests_running") < 1:
        assert not future.done() and time.monotonic() < deadline
        time.sleep(0.02)


def test_abort_ends_in_flight_requests_and_holds_new_ones_until_resume(
    url: str, pool: ThreadPoolExecutor
) -> None:
    in_flight = pool.submit(complete, url, LONG)
    wait_until_running(url, in_flight)
    assert httpx.post(f"{url}/pause", params={"mode": "abort"}).status_code == 200
    aborted = in_flight.result(timeout=30)
    assert aborted["finish_reason"] == "abort" and len(aborted["token_ids"]) < LONG
    assert httpx.get(f"{url}/is_paused").json() == {"is_paused": True}

    arrived_while_paused = pool.submit(complete, url, 5)
    time.sleep(1.0)
    assert not arrived_while_paused.done()
    httpx.post(f"{url}/resume")
    assert arrived_while_paused.result(timeout=30)["finish_reason"] == "length"
    assert httpx.get(f"{url}/is_paused").json() == {"is_paused": False}


def test_wait_lets_in_flight_requests_finish_before_pausing(
    url: str, pool: ThreadPoolExecutor
) -> None:
    in_flight = pool.submit(complete, url, 300)
    wait_until_running(url, in_flight)
    response = httpx.post(f"{url}/pause", params={"mode": "wait"}, timeout=120)
    assert response.status_code == 200
    assert gauge(url, "num_requests_running") == 0  # /pause returned once drained
    finished = in_flight.result(timeout=30)
    assert finished["finish_reason"] == "length" and len(finished["token_ids"]) == 300
    httpx.post(f"{url}/resume")


def test_keep_freezes_requests_in_place_and_resume_continues_them(
    url: str, pool: ThreadPoolExecutor
) -> None:
    uninterrupted = complete(url, 400)["token_ids"]
    in_flight = pool.submit(complete, url, 400)
    wait_until_running(url, in_flight)
    assert httpx.post(f"{url}/pause", params={"mode": "keep"}).status_code == 200
    frozen_at = gauge(url, "generation_tokens_total")
    time.sleep(1.0)
    assert not in_flight.done()
    assert gauge(url, "generation_tokens_total") == frozen_at  # nothing decoded while paused
    assert gauge(url, "num_requests_running") == 1  # but the sequence kept its place
    httpx.post(f"{url}/resume")
    resumed = in_flight.result(timeout=60)
    assert resumed["finish_reason"] == "length"
    assert resumed["token_ids"] == uninterrupted  # same greedy tokens as if never paused


def test_unknown_pause_mode_is_a_400(url: str) -> None:
    response = httpx.post(f"{url}/pause", params={"mode": "nap"})
    assert response.status_code == 400
    assert httpx.get(f"{url}/is_paused").json() == {"is_paused": False}
