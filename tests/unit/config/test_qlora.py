"""QLoRA keys: what they need, what they refuse, and how `asyncrl rl` wires the served base."""

from __future__ import annotations

import pytest
import torch

from asyncrl.config.base import ConfigError
from asyncrl.config.loading import load_config
from asyncrl.config.rl import RLConfig
from asyncrl.config.sft import SFTConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer import quantized_base
from asyncrl.trainer.quantized_base import base_quantization


def error_of(model: type, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(model, [], overrides)
    return str(caught.value)


def test_a_quantized_base_needs_lora() -> None:
    message = error_of(TrainerConfig, ["--model", "m", "--lora", "false", "--qlora_bnb", "true"])
    assert "`qlora_bnb` quantizes the base under LoRA; it needs `lora: true`" in message


def test_one_base_format_at_a_time() -> None:
    message = error_of(TrainerConfig, ["--model", "m", "--qlora_bnb", "true", "--qlora_fp8", "1"])
    assert "`qlora_bnb` and `qlora_fp8`: choose one base format" in message


def test_sft_refuses_a_quantized_base_and_says_why() -> None:
    message = error_of(SFTConfig, ["--model", "m", "--lora", "true", "--qlora_bnb", "true"])
    assert "built for the GRPO trainer" in message and "merging into" in message


def test_serving_a_dequantized_base_needs_a_quantized_one() -> None:
    message = error_of(TrainerConfig, ["--model", "m", "--qlora_served_base", "dequantized"])
    assert "`qlora_served_base: dequantized` serves a quantized base" in message


def test_fp8_is_refused_on_several_ranks_and_says_why() -> None:
    message = error_of(TrainerConfig, ["--model", "m", "--qlora_fp8", "true", "--world_size", "2"])
    assert "`qlora_fp8` with `world_size` > 1" in message and "block scales" in message
    load_config(TrainerConfig, [], ["--model", "m", "--qlora_bnb", "true", "--world_size", "2"])


def rl(*overrides: str) -> RLConfig:
    base = ["--model", "m", "--orchestrator.env", '[{"id": "reverse-text"}]',
            "--trainer.qlora_bnb", "true", "--deployment", "disaggregated"]  # fmt: skip
    return load_config(RLConfig, [], [*base, *overrides])


def test_rl_has_the_orchestrator_load_the_served_base_when_the_trainer_publishes_one() -> None:
    assert rl("--trainer.qlora_served_base", "dequantized").orchestrator.load_trainer_base
    assert not rl().orchestrator.load_trainer_base  # `original`: the servers keep their own
    message = error_of(RLConfig, ["--model", "m", "--trainer.qlora_bnb", "true",
                                  "--deployment", "disaggregated",
                                  "--orchestrator.load_trainer_base", "1"])  # fmt: skip
    assert "`orchestrator.load_trainer_base` (True) must follow `trainer.qlora_served_base`" in (
        message
    )


def test_colocated_qlora_serves_the_trainers_own_dequantized_base() -> None:
    config = rl("--deployment", "colocated")
    assert config.trainer.qlora_served_base == "dequantized"
    assert not config.orchestrator.load_trainer_base  # in memory: nothing to wait for
    message = error_of(
        RLConfig,
        ["--model", "m", "--trainer.qlora_bnb", "true", "--deployment", "colocated",
         "--trainer.qlora_served_base", "original"],
    )  # fmt: skip
    assert "set `trainer.qlora_served_base: dequantized`" in message


def config_with(key: str) -> TrainerConfig:
    return TrainerConfig(model="m", lora=True, **{key: True})


@pytest.mark.parametrize(("key", "needs"), [("qlora_fp8", "≥ 8.9"), ("qlora_fp4", "≥ 10.0")])
def test_gpu_formats_are_refused_on_this_cpu_naming_its_lack_of_compute_capability(
    key: str, needs: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        base_quantization(config_with(key), torch.float32, torch.device("cpu"))
    message = str(caught.value)
    assert f"`{key}` needs" in message and f"compute capability {needs}" in message
    assert "device is `cpu`, which has no CUDA compute capability" in message


def fake_gpu(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int]) -> torch.device:
    """A CUDA device that reports `capability` (no GPU here: the device is never used)."""
    monkeypatch.setattr(quantized_base, "compute_capability", lambda device: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a faked GPU")
    return torch.device("cuda", 0)


def test_qlora_fp8_on_a_faked_ampere_gpu_is_refused_with_its_compute_capability(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    device = fake_gpu(monkeypatch, (8, 0))
    with pytest.raises(ConfigError, match=r"a faked GPU, compute capability 8\.0"):
        base_quantization(config_with("qlora_fp8"), torch.bfloat16, device)


def test_qlora_fp8_on_a_faked_hopper_gpu_loads_fine_grained_fp8(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    quantization = base_quantization(
        config_with("qlora_fp8"), torch.bfloat16, fake_gpu(monkeypatch, (9, 0))
    )
    assert type(quantization).__name__ == "FineGrainedFP8Config"
    assert tuple(quantization.weight_block_size) == (128, 128) and not quantization.dequantize


def test_qlora_fp4_on_a_faked_blackwell_gpu_is_refused_for_lack_of_a_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match="NVFP4 layers have no backward"):
        base_quantization(config_with("qlora_fp4"), torch.bfloat16, fake_gpu(monkeypatch, (10, 0)))


def test_qlora_bnb_is_the_qlora_papers_recipe_in_the_recipes_compute_dtype() -> None:
    pytest.importorskip("bitsandbytes")
    for dtype in (torch.float32, torch.bfloat16):
        quantization = base_quantization(config_with("qlora_bnb"), dtype, torch.device("cpu"))
        assert quantization.load_in_4bit and quantization.bnb_4bit_quant_type == "nf4"
        assert quantization.bnb_4bit_use_double_quant
        assert quantization.bnb_4bit_compute_dtype == dtype
