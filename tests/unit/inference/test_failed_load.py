"""A weight load that breaks inside the engine is answered 422 with its cause, not 500.

Clients take a 5xx for a server that is down and retry it when it answers again; a load that
fails the same way each time then looped for ever (the first GPU run: a LoRA delta left on the
CPU beside CUDA weights, the run waiting on weights version 1 with no end). The fault is
injected: on a CPU every tensor is on one device, so the real one cannot happen here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from asyncrl.config.inference import InferenceConfig
from asyncrl.inference.served_model import ServedModel
from asyncrl.inference.server import build_app, load_served_model

CAUSE = "Expected all tensors to be on the same device, but found at least two devices"


@pytest.fixture
def served(tiny_model_dir: Path) -> Iterator[ServedModel]:
    served = load_served_model(InferenceConfig(model=str(tiny_model_dir), max_model_len=256))
    yield served
    served.engine.shutdown()


def test_a_load_that_breaks_in_the_engine_is_a_422_naming_its_cause(
    served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_load(*args: object) -> None:
        raise RuntimeError(CAUSE)

    monkeypatch.setattr(served, "load_lora", broken_load)
    client = TestClient(build_app(InferenceConfig(model=served.name), served))
    body = {"lora_name": "policy", "lora_path": str(tmp_path)}
    answer = client.post("/v1/load_lora_adapter", json=body)
    assert answer.status_code == 422
    message = answer.json()["error"]["message"]
    assert CAUSE in message and "RuntimeError" in message and "restart" in message
    assert client.get("/health").status_code == 200  # the server still answers
