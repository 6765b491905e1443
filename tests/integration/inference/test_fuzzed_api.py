"""Property-based: every request the server's own OpenAPI schema allows, and many it does not,
gets an answer below 500, and afterwards another client is served exactly as before.

Schemathesis generates the requests from `/openapi.json`; the server is a real process with an
API key and small limits, so each example stays cheap (a few hundred in all, under 3 minutes).
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from asyncrl.launch.inference_process import inference_server

pytestmark = pytest.mark.integration

KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
NORMAL = {"prompt": "abc", "max_tokens": 12, "temperature": 1.0, "seed": 7, "logprobs": 2}
SEEN: dict[str, Any] = {}


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    roots = tmp_path_factory.mktemp("fuzz_roots")
    with inference_server(
        tiny_model_dir, "--max_model_len", "64", "--max_prompts_per_request", "8",
        "--max_queued_seqs", "64", "--weight_roots", f"[{roots}]", env={"VLLM_API_KEY": KEY},
    ) as server:  # fmt: skip
        yield server


DERANDOMIZE = os.environ.get("ASYNCRL_FUZZ_RANDOM") != "1"


def normal_answer(url: str) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/completions", json=NORMAL, headers=AUTH, timeout=60)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return {"text": choice["text"], "logprobs": choice["logprobs"]["token_logprobs"]}


def test_a_normal_request_before_the_fuzzing(url: str) -> None:
    SEEN["before"] = normal_answer(url)


def operations(url: str) -> list[schemathesis.APIOperation]:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=AUTH)
    return [result.ok() for result in schema.get_all_operations()]


def test_no_request_the_schema_allows_gets_a_5xx(url: str) -> None:
    """Every operation in turn (schemathesis' pytest plugin does not run on pytest 9: its
    strategies are driven with hypothesis directly). Derandomized, so CI sees the same requests
    every run; set ASYNCRL_FUZZ_RANDOM=1 to explore new ones."""
    checked, statuses = [], []
    for operation, mode in itertools.product(operations(url), schemathesis.GenerationMode):

        @settings(
            max_examples=40, deadline=None, database=None, derandomize=DERANDOMIZE,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )  # fmt: skip
        @given(case=operation.as_strategy(mode))  # positive: valid bodies, negative: not
        def answers_below_500(case: schemathesis.Case) -> None:
            statuses.append(0)
            try:
                response = case.call(base_url=url, headers=AUTH, timeout=60)
                statuses[-1] = response.status_code
                assert response.status_code < 500, (case.as_curl_command(), response.text[:500])
            finally:  # a fuzzed /pause must not hold the next example's requests
                httpx.post(f"{url}/resume", headers=AUTH, timeout=60)

        try:
            answers_below_500()
        except Unsatisfiable:  # nothing to get wrong: a route without parameters or body
            assert mode == schemathesis.GenerationMode.NEGATIVE
            continue
        checked.append(f"{operation.label} {mode.value}")
    print(f"{len(statuses)} requests: {sorted(collections.Counter(statuses).items())}")
    assert len(statuses) >= 200  # a few hundred examples in all
    assert "POST /v1/completions negative" in checked
    assert "POST /v1/chat/completions positive" in checked


def test_another_client_is_served_exactly_as_before(url: str) -> None:
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/is_paused", headers=AUTH).json() == {"is_paused": False}
    assert normal_answer(url) == SEEN["before"]
