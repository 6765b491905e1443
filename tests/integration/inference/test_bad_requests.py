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
        # values that passed validation once and broke the shared engine step (issue 19)
        ("/v1/completions", {"prompt": "a", "temperature": 1e-50}, 400, "temperature"),
        ("/v1/completions", {"prompt": "a", "repetition_penalty": 5e-324}, 400, "repetition"),
        (
            "/v1/completions",
            {"prompt": "a", "min_tokens": 2, "stop_token_ids": [10**6]},
            400,
            "vocabulary size",
        ),
        ("/v1/completions", {"prompt": "a", "seed": 2**63}, 400, "seed"),
        ("/v1/completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "a", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
        ("/v1/completions", {"prompt": [True]}, 400, "prompt"),
        ("/v1/completions", {"prompt": []}, 400, "empty"),
        ("/v1/completions", {"prompt": ["a"] * 1025}, 400, "prompts in one request"),
        ("/v1/completions", {"prompt": "a" * 8193}, 400, "characters"),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "chat_template_kwargs": {"chat_template": "{{ 'a' * 5000000 }}"},
            },
            400,
            "chat_template",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "chat_template_kwargs": {"tokenize": True},
            },
            400,
            "may not set",
        ),
        ("/tokenize", {"messages": [{"role": "user", "content": None}]}, 400, "template"),
        ("/update_weights", {"weight_dir": "a\x00b"}, 400, "NUL"),
        ("/v1/load_lora_adapter", {"lora_name": "0", "lora_path": "~0"}, 400, "~0"),
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


def test_a_lone_surrogate_is_a_400(server_url: str) -> None:
    """Valid JSON (an escape), but not text: it used to reach the tokenizer and give a 500."""
    response = httpx.post(
        f"{server_url}/v1/completions",
        content=b'{"prompt": "a\\ud800b"}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400 and "Unicode" in response.json()["error"]["message"]


def test_top_logprobs_come_back_complete_and_finite(server_url: str) -> None:
    """Twenty asked, twenty returned (ids with the same text no longer overwrite each other),
    and a token top-k removed is -9999, not -inf (which is not JSON)."""
    body = {"prompt": "ab", "max_tokens": 4, "logprobs": 20, "top_k": 5, "seed": 1}
    response = httpx.post(f"{server_url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    tops = response.json()["choices"][0]["logprobs"]["top_logprobs"]
    assert all(len(step) == 20 for step in tops)
    assert all(value == -9999.0 for step in tops for value in sorted(step.values())[:15])


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
