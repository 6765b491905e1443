"""Reference logprobs for β·KL: the starting policy, however the policy has moved since."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.trainer.reference import build_reference, maybe_sync_reference, reference_logprobs_for
from asyncrl.types import TrainingBatch, TrainingSample

BATCH = TrainingBatch(
    step=1,
    samples=[
        TrainingSample(
            prompt_ids=[40, 41, 42],
            completion_ids=[50, 51, 52, 53],
            completion_mask=[True] * 4,
            inference_logprobs=[-1.0] * 4,
            advantages=[1.0] * 4,
            policy_versions=[0] * 4,
            temperature=0.8,
            env="e",
        )
    ],
)


def logprobs(model: torch.nn.Module) -> torch.Tensor:
    mb = build_micro_batches(BATCH, 32, 1, 0, "token")[0]
    with torch.no_grad():
        return completion_logprobs(model, mb.packed, mb.temperature).logprobs


def nudge(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(0.05 * torch.randn_like(parameter))


def test_full_fine_tuning_reference_is_a_frozen_copy_of_the_start(tiny_model_dir: Path) -> None:
    config = TrainerConfig(
        model=str(tiny_model_dir),
        lora=False,
        recipe="fp32",
        loss={"type": "grpo_clip", "beta": 0.1},
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    start = logprobs(model)
    reference = build_reference(model, config)
    assert reference is not None
    nudge(model)
    mb = build_micro_batches(BATCH, 32, 1, 0, "token")[0]
    got = reference_logprobs_for(reference, model, mb, config)
    assert torch.allclose(got, start, atol=1e-6)
    assert not torch.allclose(logprobs(model), start, atol=1e-3)


def test_lora_reference_is_the_base_with_adapters_disabled(tiny_model_dir: Path) -> None:
    config = TrainerConfig(
        model=str(tiny_model_dir), lora=True, recipe="fp32", loss={"type": "grpo_clip", "beta": 0.1}
    )
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    start = logprobs(base)
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert build_reference(model, config) is None  # no copy: the base is the reference
    nudge(model)  # moves only the adapters
    mb = build_micro_batches(BATCH, 32, 1, 0, "token")[0]
    got = reference_logprobs_for(None, model, mb, config)
    assert torch.allclose(got, start, atol=1e-6)
    assert not torch.allclose(logprobs(model), start, atol=1e-3)


def test_reference_sync_mixes_in_the_policy_every_n_steps(tiny_model_dir: Path) -> None:
    config = TrainerConfig(
        model=str(tiny_model_dir), lora=False, loss={"type": "grpo_clip", "beta": 0.1},
        sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.25,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = build_reference(model, config)
    start = [p.detach().clone() for p in reference.parameters()]
    nudge(model)
    maybe_sync_reference(reference, model, step=1, config=config)  # not a sync step
    assert all(torch.equal(r, s) for r, s in zip(reference.parameters(), start, strict=True))
    maybe_sync_reference(reference, model, step=2, config=config)
    for ref, old, new in zip(reference.parameters(), start, model.parameters(), strict=True):
        assert torch.allclose(ref, 0.75 * old + 0.25 * new, atol=1e-6)
