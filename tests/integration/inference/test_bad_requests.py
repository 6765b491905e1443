"""Every bad request gets a 4xx with a message, and the server keeps serving."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/v1/completions", {"model": "nope", "prompt": "a"}, 404, "does not exist"),
        ("/v1/completions", {"prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "a" * 300}, 400, "max_model_len is 256"),
        ("/v1/completions", {"prompt": "a" * 250, "max_tokens": 10}, 400, "maximum context"),
        ("/v1/completions", {"prompt": [5, 999]}, 400, "vocabulary size"),
        ("/v1/completions", {"prompt": ""}, 400, "empty"),
        ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
        ("/v1/completions", {"prompt": "a", "temperature": "hot"}, 400, "temperature"),
        ("/v1/completions", {"prompt": "a", "stream": True}, 400, "stream"),
        ("/v1/completions", {"prompt": "a", "frequency_penalty": 0.5}, 400, "frequency_penalty"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "role"),
        ("/update_weights", {"weight_dir": "/etc"}, 400, "outside the allowed"),
        ("/v1/unload_lora_adapter", {"lora_name": "ghost"}, 400, "not loaded"),
        ("/tokenize", {}, 400, "exactly one"),
    ],
)
def test_bad_request_is_a_4xx_with_a_message(
    server_url: str, path: str, body: dict, status: int, says: str
) -> None:
    response = httpx.post(f"{server_url}{path}", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]["message"]


def test_malformed_json_is_a_400(server_url: str) -> None:
    response = httpx.post(
        f"{server_url}/v1/completions",
        content=b'{"prompt": "a", ',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400 and "error" in response.json()


def test_oversize_body_is_a_413(server_url: str) -> None:
    response = httpx.post(f"{server_url}/v1/completions", json={"prompt": "a" * 100_000})
    assert response.status_code == 413 and "exceeds" in response.json()["error"]["message"]


def test_unknown_route_is_a_404(server_url: str) -> None:
    assert httpx.get(f"{server_url}/v2/nothing").status_code == 404


def test_server_still_serves_after_all_of_that(server_url: str, tiny_model_dir: Path) -> None:
    response = httpx.post(
        f"{server_url}/v1/completions",
        json={"model": str(tiny_model_dir), "prompt": "ok", "max_tokens": 3},
    )
    assert response.status_code == 200 and len(response.json()["choices"]) == 1
