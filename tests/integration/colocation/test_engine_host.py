"""The colocated engine inside a trainer process: after each step it holds exactly the trainer's
weights (the same tensors for full fine-tuning, W + (α/r)·B·A for LoRA), `/weight_info` says so,
and a request sent while the trainer steps waits, then is answered by the new weights."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from asyncrl.colocation.engine_host import ColocatedInference
from asyncrl.config.inference import InferenceConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.inference.engine_thread import FAILED_STEPS_BEFORE_GIVING_UP
from asyncrl.inference.server import EngineFailed
from asyncrl.launch.inference_process import free_port
from asyncrl.trainer.model import load_model
from asyncrl.transport.fingerprint import weights_fingerprint

pytestmark = pytest.mark.integration

PROMPT = [70, 71, 72, 73]
MAX_TOKENS = 8


@pytest.fixture(params=[False, True], ids=["full", "lora"])
def colocated(
    request: pytest.FixtureRequest, tiny_model_dir: Path
) -> Iterator[tuple[ColocatedInference, torch.nn.Module, str]]:
    lora: bool = request.param
    trainer = TrainerConfig(model=str(tiny_model_dir), lora=lora, recipe="fp32", lora_rank=4,
                            lora_alpha=16, lora_target_modules=["q_proj", "v_proj"])  # fmt: skip
    model = load_model(trainer)
    port = free_port()
    served = InferenceConfig(model=str(tiny_model_dir), port=port, dtype="float32",
                             max_model_len=128, enable_lora=lora)  # fmt: skip
    inference = ColocatedInference(served, model, version=0)
    try:
        yield inference, model, f"http://127.0.0.1:{port}"
    finally:
        inference.close()


def training_step(model: torch.nn.Module) -> None:
    """A real, large step, so that the new weights answer visibly differently."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=5e-2)
    ids = torch.tensor([PROMPT * 4])
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def complete(url: str) -> dict[str, Any]:
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "logprobs": 0, "return_token_ids": True, "ignore_eos": True}  # fmt: skip
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def greedy_logprobs(model: torch.nn.Module, tokens: list[int]) -> list[float]:
    """The logprob of each completion token under `model`, from one plain forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT + tokens])).logits[0].float()
    steps = torch.log_softmax(logits[len(PROMPT) - 1 : -1], dim=-1)
    return steps[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()


def merged_by_hand(model: torch.nn.Module, name: str) -> torch.Tensor:
    """W + (α/r)·B·A for the adapted weight `name`, read from the PEFT module's own tensors."""
    module = model.get_submodule(f"base_model.model.{name.removesuffix('.weight')}")
    a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
    return module.base_layer.weight + (16 / 4) * b @ a


def test_engine_weights_follow_the_trainer_and_a_waiting_request_gets_the_new_ones(
    colocated: tuple[ColocatedInference, torch.nn.Module, str],
) -> None:
    inference, model, url = colocated
    model.eval()  # no dropout in the reference forward passes
    lora = hasattr(model, "peft_config")
    info = httpx.get(f"{url}/weight_info").json()
    assert info["version"] == 0
    before = complete(url)

    inference.sleep()
    assert inference.engine.cache.nbytes == 0
    answers: list[dict[str, Any]] = []
    waiting = threading.Thread(target=lambda: answers.append(complete(url)))
    waiting.start()
    waiting.join(timeout=1.0)
    assert waiting.is_alive()  # held while the trainer steps
    training_step(model)
    metrics = inference.wake(1, model)
    waiting.join(timeout=60)
    assert metrics["inference/kv_cache_bytes"] == inference.engine.cache.nbytes > 0

    engine = dict(inference.engine.model.named_parameters())
    trained = {n.removeprefix("base_model.model."): p for n, p in model.named_parameters()}
    if lora:
        adapted = [n for n in engine if n.endswith(("q_proj.weight", "v_proj.weight"))]
        assert adapted
        for name in adapted:
            assert torch.allclose(engine[name], merged_by_hand(model, name), atol=1e-6)
        for name in set(engine) - set(adapted):  # the base never changes
            assert torch.equal(engine[name], trained[name])
    else:
        for name, parameter in engine.items():
            assert torch.equal(parameter, trained[name])
            assert parameter.data_ptr() == trained[name].data_ptr()  # shared, not copied
    info = httpx.get(f"{url}/weight_info").json()
    assert info["version"] == 1
    assert info["fingerprint"] == weights_fingerprint(inference.engine.model.named_parameters())

    (answer,) = answers
    served = answer["logprobs"]["token_logprobs"]
    expected = greedy_logprobs(model, answer["token_ids"])  # the trainer's own forward pass
    assert served == pytest.approx(expected, abs=1e-4)
    assert answer["token_ids"] != before["token_ids"] or served != pytest.approx(
        before["logprobs"]["token_logprobs"], abs=1e-3
    )


def test_a_qlora_trainers_engine_serves_its_dequantized_base_with_adapters_merged(
    tiny_model_dir: Path,
) -> None:
    """With an NF4 base the engine takes the whole base dequantized (the layers LoRA does not
    adapt are quantized too), so it answers exactly as the trainer's own forward pass."""
    pytest.importorskip("bitsandbytes")
    from asyncrl.trainer.quantized_base import dequantized_base

    trainer = TrainerConfig(model=str(tiny_model_dir), lora=True, qlora_bnb=True,
                            qlora_served_base="dequantized", recipe="fp32", lora_rank=4,
                            lora_alpha=16, lora_target_modules=["q_proj", "v_proj"])  # fmt: skip
    model = load_model(trainer)
    port = free_port()
    served = InferenceConfig(model=str(tiny_model_dir), port=port, dtype="float32",
                             max_model_len=128, enable_lora=True)  # fmt: skip
    inference = ColocatedInference(served, model, version=0)
    try:
        inference.sleep()
        training_step(model)
        inference.wake(1, model)
        model.eval()
        engine = dict(inference.engine.model.named_parameters())
        base = dequantized_base(model)
        key = "model.layers.0.self_attn.k_proj.weight"  # quantized, not adapted
        assert torch.equal(engine[key], base[key])
        name = "model.layers.0.self_attn.q_proj.weight"  # quantized and adapted
        module = model.get_submodule(f"base_model.model.{name.removesuffix('.weight')}")
        a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
        torch.testing.assert_close(engine[name], base[name] + (16 / 4) * b @ a, atol=1e-6, rtol=0)
        answer = complete(f"http://127.0.0.1:{port}")
        expected = greedy_logprobs(model, answer["token_ids"])
        assert answer["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=1e-4)
    finally:
        inference.close()


@pytest.mark.parametrize("colocated", [False], indirect=True, ids=["full"])
def test_an_engine_that_gave_up_stops_the_trainer_waiting_for_a_batch(
    colocated: tuple[ColocatedInference, torch.nn.Module, str],
) -> None:
    """Fault injected (the engine model's forward raises on every step): the trainer's check
    between slices of its wait for a batch raises, naming why, instead of waiting for a batch
    no rollout will make; so does the sleep before a step."""
    inference, _, url = colocated

    def forward(*args: object, **kwargs: object) -> None:
        raise TypeError("injected")

    inference.engine.model.forward = forward
    inference.check()  # a healthy engine: nothing to say
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS}
    for _ in range(FAILED_STEPS_BEFORE_GIVING_UP):
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert response.json()["choices"][0]["finish_reason"] == "abort"
    said = rf"{FAILED_STEPS_BEFORE_GIVING_UP} engine steps in a row failed.*TypeError: injected"
    with pytest.raises(EngineFailed, match=said):
        inference.check()
    with pytest.raises(EngineFailed):
        inference.sleep()
    assert httpx.get(f"{url}/health").status_code == 503
