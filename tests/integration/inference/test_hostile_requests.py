"""Requests that used to hold or poison the shared server: each now costs only its sender.

A dedicated server per test (limits set low, a key, a pause): the session server stays clean.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from asyncrl.launch.inference_process import free_port, inference_server, wait_healthy

pytestmark = pytest.mark.integration

KEY = "test-key-19"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = {"prompt": "go", "max_tokens": 900, "temperature": 1.0, "ignore_eos": True, "seed": 5}
POISON = [  # each once passed validation and aborted every client's generation
    {"prompt": "a", "temperature": 1e-50},
    {"prompt": "a", "repetition_penalty": 5e-324},
    {"prompt": "a", "min_tokens": 3, "stop_token_ids": [10**6]},
    {"prompt": "a", "top_k": 10**19, "top_p": 5e-324},
]


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path) -> Iterator[str]:
    with inference_server(
        tiny_model_dir, "--max_model_len", "1024", "--max_num_seqs", "4",
        "--max_queued_seqs", "8", "--request_read_timeout", "1", env={"VLLM_API_KEY": KEY},
    ) as server:  # fmt: skip
        yield server


def gauge(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return float(re.search(rf"^asyncrl:{name}\S* (\S+)$", text, re.M)[1])


def test_the_key_is_checked_before_the_body_is_parsed(url: str) -> None:
    malformed = b'{"prompt": '
    headers = {"content-type": "application/json"}
    response = httpx.post(f"{url}/v1/completions", content=malformed, headers=headers)
    assert response.status_code == 401  # not 400: nothing is parsed for a stranger
    response = httpx.post(f"{url}/v1/completions", content=malformed, headers=headers | AUTH)
    assert response.status_code == 400
    assert httpx.get(f"{url}/health").status_code == 200  # probes need no key


def test_a_poisoned_request_cannot_abort_another_clients_request(url: str) -> None:
    alone = httpx.post(f"{url}/v1/completions", json=LONG | {"max_tokens": 200}, headers=AUTH,
                       timeout=120).json()["choices"][0]  # fmt: skip
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(
            httpx.post, f"{url}/v1/completions", json=LONG | {"max_tokens": 200}, headers=AUTH,
            timeout=120,
        )  # fmt: skip
        while gauge(url, "num_requests_running") < 1:
            time.sleep(0.01)
        for body in POISON:
            response = httpx.post(f"{url}/v1/completions", json=body, headers=AUTH, timeout=60)
            assert response.status_code in (200, 400), response.text
        together = other.result(timeout=120).json()["choices"][0]
    assert together["finish_reason"] == "length" and together["text"] == alone["text"]


def test_a_client_that_goes_away_stops_its_generation(url: str) -> None:
    before = gauge(url, "generation_tokens_total")
    body = LONG | {"n": 4}  # 3,600 tokens if nobody stops them
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", json=body, headers=AUTH, timeout=1.0)
    deadline = time.monotonic() + 10
    while gauge(url, "num_requests_running") > 0:
        assert time.monotonic() < deadline, "the abandoned request is still generating"
        time.sleep(0.05)
    assert gauge(url, "generation_tokens_total") - before < 4 * 900


def test_a_full_queue_answers_503_and_a_request_too_big_for_it_400(url: str) -> None:
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(
            httpx.post, f"{url}/v1/completions", json=LONG | {"n": 8}, headers=AUTH, timeout=300
        )
        while gauge(url, "num_requests_running") < 4:  # 4 slots busy, 4 waiting
            time.sleep(0.01)
        full = httpx.post(f"{url}/v1/completions", json=LONG | {"n": 5}, headers=AUTH)
        assert full.status_code == 503, full.text  # clients retry 5xx with backoff
        httpx.post(f"{url}/pause", params={"mode": "abort"}, headers=AUTH)
        httpx.post(f"{url}/resume", headers=AUTH)
        busy.result(timeout=60)
    too_big = httpx.post(f"{url}/v1/completions", json=LONG | {"n": 9}, headers=AUTH)
    assert too_big.status_code == 400 and "at most 8" in too_big.text


def test_a_body_that_never_finishes_arriving_is_a_408(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"prompt": '
        )
        started = time.monotonic()
        answer = connection.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 5


def test_sigterm_ends_a_paused_server_that_holds_a_request(tiny_model_dir: Path) -> None:
    """It lived 56 s after SIGTERM: the graceful shutdown waited on a request held by the
    pause, which could never finish."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "infer", "--model", str(tiny_model_dir),
         "--port", str(port), "--max_model_len", "1024"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, 120)
        httpx.post(f"{url}/pause", params={"mode": "keep"})
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(httpx.post, f"{url}/v1/completions", json=LONG, timeout=60)
            time.sleep(1.0)
            assert not held.done()
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
            assert time.monotonic() - started < 10
            answer = held.result(timeout=10)
            assert answer.json()["choices"][0]["finish_reason"] == "abort"
    finally:
        process.kill()
        process.wait()
