"""An int8 engine (`inference.quantization: int8`) on the tiny model: every way weights change
(a full load, weights received in memory, a LoRA merge and its unloading) quantizes the new float
weights afresh, the logprobs it returns are its int8 model's, and the setting is refused where
an engine shares the trainer's weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.unit.inference.test_served_fingerprint import save_adapter
from transformers import AutoModelForCausalLM

from asyncrl.config.inference import InferenceConfig
from asyncrl.config.rl import RLConfig
from asyncrl.inference.control_routes import _info
from asyncrl.inference.int8_linears import is_int8, quantize_per_output_channel
from asyncrl.inference.sampling import SamplingParams
from asyncrl.inference.served_model import ServedModel
from asyncrl.inference.server import load_served_model


@pytest.fixture
def served(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ServedModel]:
    config = InferenceConfig(
        model=str(tiny_model_dir), max_model_len=256, enable_lora=True,
        weight_roots=[str(tmp_path)], dtype="float32", quantization="int8",
    )  # fmt: skip
    served = load_served_model(config)
    yield served
    served.engine.shutdown()


def assert_quantized_from(model: torch.nn.Module, floats: dict[str, torch.Tensor]) -> None:
    """Every int8 layer holds the quantization of `floats` (by parameter name): its float
    weight equals it exactly, and its int8 copy and scales are that weight's own."""
    checked = 0
    for name, module in model.named_modules():
        if not is_int8(module):
            continue
        key = f"{name}.weight"
        weight = floats[key] if key in floats else floats["model.embed_tokens.weight"]  # tied
        assert torch.equal(module.weight, weight), name  # the float weight, never dequantized
        values, scales = quantize_per_output_channel(weight)
        assert torch.equal(module.int8_weight.values, values), name
        assert torch.equal(module.int8_weight.scales, scales), name
        checked += 1
    assert checked > 0


def perturbed_checkpoint(tiny_model_dir: Path, out: Path, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.save_pretrained(out)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_the_server_reports_int8_and_quantizes_every_linear_it_loaded(
    served: ServedModel, tiny_model_dir: Path
) -> None:
    loaded = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert_quantized_from(served.engine.model, dict(loaded.named_parameters()))
    report = _info(served.info())  # what /weight_info answers
    assert (report["dtype"], report["quantization"]) == ("float32", "int8")


def test_a_full_load_and_weights_received_in_memory_are_quantized_afresh(
    served: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    first = perturbed_checkpoint(tiny_model_dir, tmp_path / "step_1", seed=1)
    served.update_weights(str(tmp_path / "step_1"), None)
    assert_quantized_from(served.engine.model, first)

    second = perturbed_checkpoint(tiny_model_dir, tmp_path / "step_2", seed=2)
    served.apply_received(2, {name: t.clone() for name, t in second.items()}, source="memory")
    assert_quantized_from(served.engine.model, second)


def test_a_lora_merge_is_quantized_from_the_merged_float_weight_and_unloading_restores_the_base(
    served: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    base = {n: p.detach().clone() for n, p in served.engine.model.named_parameters()}
    first = save_adapter(tiny_model_dir, tmp_path / "step_1", seed=1)
    second = save_adapter(tiny_model_dir, tmp_path / "step_2", seed=2)
    model = served.engine.model

    served.load_lora("policy", str(tmp_path / "step_1"), False, None)
    merged = {n: served.engine.model.get_parameter(n).detach().clone() for n in base}
    for name, parameter in first.named_parameters():  # merged as PEFT merges, in float
        torch.testing.assert_close(merged[name], parameter.detach(), rtol=0, atol=1e-5)
    assert_quantized_from(model, merged)

    served.load_lora("policy", str(tmp_path / "step_2"), True, None)  # on the base, not stacked
    merged = {n: served.engine.model.get_parameter(n).detach().clone() for n in base}
    for name, parameter in second.named_parameters():
        torch.testing.assert_close(merged[name], parameter.detach(), rtol=0, atol=1e-5)
    assert_quantized_from(model, merged)

    served.unload_lora("policy")
    assert_quantized_from(model, base)


def test_int8_greedy_tokens_are_the_same_batched_or_alone(served: ServedModel) -> None:
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [[70, 71, 72], [80], [90, 91, 92, 93, 94, 95, 96], [75, 76]]
    engine = served.engine
    alone = [engine.submit(p, greedy).done.result(timeout=120)[0].token_ids for p in prompts]
    requests = [engine.submit(p, greedy) for p in prompts]
    assert [r.done.result(timeout=120)[0].token_ids for r in requests] == alone


def test_int8_is_a_setting_of_an_embedded_engine_of_its_own() -> None:
    with pytest.raises(ValueError, match="--quantization"):
        InferenceConfig(model="m", backend="vllm", quantization="int8")
    base = {"model": "m", "inference": {"quantization": "int8"}, "orchestrator": {}, "trainer": {}}
    with pytest.raises(ValueError, match="colocated engine shares the trainer's weights"):
        RLConfig(**base, deployment="colocated")
    assert RLConfig(**base, deployment="disaggregated").inference.quantization == "int8"


def test_the_logprobs_an_int8_engine_returns_are_its_int8_model_s_not_the_float_one_s(
    served: ServedModel,
) -> None:
    """What a float trainer's `mismatch_kl` and importance weights compare: the engine's
    logprobs are those of the policy that sampled (the int8 layers), so they differ from the
    float model's by the quantization and the correction sees it."""
    prompt = [70, 71, 72, 73]
    sampled = SamplingParams(max_tokens=16, temperature=1.0, seed=3, ignore_eos=True)
    output = served.engine.submit(prompt, sampled).done.result(timeout=120)[0]
    model, ids = served.engine.model, torch.tensor([prompt + output.token_ids])
    tokens = torch.tensor(output.token_ids)[:, None]

    def recomputed() -> torch.Tensor:
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(1, tokens)[:, 0].detach()

    with torch.no_grad():  # the engine's path: the int8 copies
        int8 = recomputed()
    with torch.enable_grad():  # a trainer's path: the float weights
        float32 = recomputed()
    returned = torch.tensor(output.logprobs)
    to_int8 = (returned - int8).abs().max()
    to_float = (returned - float32).abs().max()
    assert to_float > 1e-3  # the quantization moves the tiny model's logprobs measurably
    assert to_int8 < to_float / 10  # and what the engine returns is the int8 model's
