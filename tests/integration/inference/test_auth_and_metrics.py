"""API key (bearer) when one is configured, and the Prometheus /metrics page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from asyncrl.launch.inference_process import inference_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def keyed_url(tiny_model_dir: Path) -> Iterator[str]:
    env = {"ASYNCRL_TEST_KEY": "s3cret"}
    with inference_server(tiny_model_dir, "--api_key_var", "ASYNCRL_TEST_KEY", env=env) as url:
        yield url


def test_requests_without_the_key_are_refused(keyed_url: str) -> None:
    for path in ("/v1/models", "/weight_info", "/is_paused"):
        assert httpx.get(f"{keyed_url}{path}").status_code == 401
    wrong = {"Authorization": "Bearer guess"}
    assert httpx.post(f"{keyed_url}/pause", headers=wrong).status_code == 401
    assert httpx.get(f"{keyed_url}/is_paused").status_code == 401
    assert httpx.get(f"{keyed_url}/health").status_code == 200  # liveness stays open


def test_the_openai_client_with_the_key_is_served(keyed_url: str) -> None:
    client = openai.OpenAI(base_url=f"{keyed_url}/v1", api_key="s3cret", max_retries=0)
    assert client.completions.create(model=client.models.list().data[0].id, prompt="a",
                                     max_tokens=2).choices  # fmt: skip
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{keyed_url}/v1", api_key="no", max_retries=0).models.list()


def test_metrics_count_generated_and_prefilled_tokens(server_url: str) -> None:
    def totals() -> tuple[float, float]:
        text = httpx.get(f"{server_url}/metrics").text
        for name in ("tokens_per_s", "num_requests_running", "num_requests_waiting",
                     "kv_cache_usage_perc"):  # fmt: skip
            assert f"asyncrl:{name}" in text
        return tuple(  # type: ignore[return-value]
            float(re.search(rf"^asyncrl:{name}\S* (\S+)$", text, re.M)[1])  # type: ignore[index]
            for name in ("generation_tokens_total", "prefill_tokens_total")
        )

    generated, prefilled = totals()
    prompt = [11, 29, 7, 31, 13]  # token ids no earlier test sent: nothing of it is cached
    httpx.post(f"{server_url}/v1/completions",
               json={"prompt": prompt, "max_tokens": 7, "ignore_eos": True})  # fmt: skip
    now_generated, now_prefilled = totals()
    assert (now_generated - generated, now_prefilled - prefilled) == (7, 5)
