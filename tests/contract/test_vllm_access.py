"""Issue 60 (5), 85 (1) and 86 (1, 2) on a real vLLM: keyed as a run's server is (by the key the
run's secret gives `VLLM_API_KEY`, which nobody set), every route but /health, /version and
/metrics needs it (vLLM's own key guards `/v1` only; asyncrl's guard, handed to vLLM as
`--middleware`, covers the development routes too), the key is in no vLLM process's environment
(it reaches the guard over a socket), and the worker extension reloads only from under
`weight_roots`: a path elsewhere is refused and the served weights stay as they were; a version
the trainer wrote is checked against its manifest before vLLM's reload sees it. The unit tests
(`tests/unit/inference/test_server_access.py`) check every piece without vLLM; this checks that
vLLM takes them as meant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.contract.conftest import running, tiny_model
from tests.unit.inference.weight_versions import flip_bit, publish, route, trained

from asyncrl.run_secret import server_key
from asyncrl.transport.weights.manifest import read_manifest

pytestmark = [pytest.mark.integration, pytest.mark.contract, pytest.mark.slow]

SECRET = "contract-access-run-secret-0123456789"
KEY = server_key("VLLM_API_KEY", {"ASYNCRL_RUN_SECRET": SECRET})
WITH_KEY = {"Authorization": f"Bearer {KEY}"}
TENSOR = "model.layers.1.mlp.up_proj.weight"


def environments_holding(text: str) -> list[str]:
    """The command lines of the processes whose environment holds `text` (readable here: the
    tests run as the processes' user, or root)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "environ").read_bytes():
                found.append((entry / "cmdline").read_bytes().decode(errors="replace"))
        except OSError:
            continue
    return found


def first_logprobs(url: str, model: str) -> list[float]:
    response = httpx.post(
        f"{url}/v1/completions", headers=WITH_KEY, timeout=120,
        json={"model": model, "prompt": "the cat", "max_tokens": 4, "temperature": 0.0,
              "logprobs": 0, "ignore_eos": True},
    )  # fmt: skip
    assert response.status_code == 200, response.text
    logprobs: list[float] = response.json()["choices"][0]["logprobs"]["token_logprobs"]
    return logprobs


def test_a_keyed_vllm_guards_every_route_and_reloads_only_from_its_roots(
    contract_root: Path,
) -> None:
    root = contract_root / "access"
    base = tiny_model(root / "weights" / "base")
    outside = tiny_model(root / "elsewhere", seed=5)  # the same shape, other weights
    log = contract_root / "vllm-access.log"
    with running("vllm", base, root / "weights", log, env={"ASYNCRL_RUN_SECRET": SECRET}) as engine:
        url = engine.url
        assert environments_holding(KEY) == []  # vLLM used to get it in $VLLM_API_KEY
        unauthenticated: list[tuple[str, str, Any]] = [
            ("GET", "/v1/models", None),
            ("POST", "/collective_rpc", {"method": "asyncrl_extension"}),
            ("GET", "/is_paused", None),
            ("POST", "/pause", None),
            ("POST", "/sleep", None),
            ("POST", "/reset_prefix_cache", None),
            ("POST", "/invocations", {"prompt": "x"}),
        ]
        for method, path, body in unauthenticated:
            answer = httpx.request(method, f"{url}{path}", json=body, timeout=30)
            assert answer.status_code == 401, (path, answer.status_code, answer.text[:200])
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200

        rpc = f"{url}/collective_rpc"
        probe = httpx.post(rpc, json={"method": "asyncrl_extension"}, headers=WITH_KEY, timeout=60)
        assert probe.status_code == 200, probe.text

        before = first_logprobs(url, engine.model)
        refused = httpx.post(
            rpc, headers=WITH_KEY, timeout=120,
            json={"method": "asyncrl_reload_weights", "kwargs": {"weights_path": str(outside)}},
        )  # fmt: skip
        assert refused.status_code != 200
        assert "outside the allowed weight roots" in (refused.text + log.read_text())
        assert first_logprobs(url, engine.model) == before  # still serving, the same weights

        inside = tiny_model(root / "weights" / "step_1", seed=5)
        loaded = httpx.post(
            rpc, headers=WITH_KEY, timeout=120,
            json={"method": "asyncrl_reload_weights", "kwargs": {"weights_path": str(inside)}},
        )  # fmt: skip
        assert loaded.status_code == 200, loaded.text
        assert first_logprobs(url, engine.model) != before

        # a version the trainer wrote, with its manifest: a bit flipped in the files never
        # reaches vLLM (read twice, refused naming the tensor); the intact one is loaded and
        # the worker says which trainer fingerprint it checked
        files = route(base, root / "weights" / "run")
        version = publish(files, 2, trained(base, seed=6))
        manifest = read_manifest(version)
        assert manifest is not None
        flip_bit(version / "model.safetensors", TENSOR)
        served = first_logprobs(url, engine.model)
        damaged = httpx.post(
            rpc, headers=WITH_KEY, timeout=120,
            json={"method": "asyncrl_reload_weights", "kwargs": {"weights_path": str(version)}},
        )  # fmt: skip
        assert damaged.status_code != 200
        assert TENSOR in (damaged.text + log.read_text())
        assert first_logprobs(url, engine.model) == served
        flip_bit(version / "model.safetensors", TENSOR)  # back as the trainer wrote it
        checked = httpx.post(
            rpc, headers=WITH_KEY, timeout=120,
            json={"method": "asyncrl_reload_weights", "kwargs": {"weights_path": str(version)}},
        )  # fmt: skip
        assert checked.status_code == 200, checked.text
        results = checked.json()["results"]
        assert [result["verified"] for result in results] == [manifest.fingerprint]
        assert first_logprobs(url, engine.model) != served
