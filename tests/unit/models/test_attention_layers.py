"""Sliding-window layers (Gemma 3) served and trained as the model's own forward computes them,
past the window: the embedded engine's KV-cache mask, the trainer's shared-prefix and packed
rows, and LoRA on Gemma 3's module names. Before `models/attention_layers.py`, the engine and
shared-prefix rows let every layer see the whole sequence (|Δ logprob| ~0.3 at 40 tokens)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from tests.unit.models.tiny_gemma3 import WINDOW, write_tiny_gemma3
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig

from asyncrl.config.training import DEFAULT_LORA_TARGETS
from asyncrl.inference.engine import Engine
from asyncrl.inference.sampling import SamplingParams
from asyncrl.models.attention_layers import UnsupportedAttentionError, check_attention_layers
from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.types import TrainingBatch, TrainingSample

SEQ_LEN = 128


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gemma3(tmp_path_factory.mktemp("models") / "tiny-gemma3")


def load(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()


def plain_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list:
    """log_softmax of the model's own forward over the whole sequence, at each completion token."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0]
    logprobs = torch.log_softmax(logits.float(), -1)
    return [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


def test_the_engine_serves_sliding_window_layers_as_the_models_own_forward(
    gemma_dir: Path,
) -> None:
    model = load(gemma_dir)
    engine = Engine(model, AutoTokenizer.from_pretrained(gemma_dir), max_num_seqs=4,
                    max_model_len=SEQ_LEN)  # fmt: skip
    prompts = [[5 + (7 * i) % 100 for i in range(5 * WINDOW)], [9, 10, 11], list(range(20, 40))]
    params = SamplingParams(max_tokens=2 * WINDOW, temperature=1.0, seed=3, ignore_eos=True)
    try:
        requests = [engine.submit(prompt, params) for prompt in prompts]  # batched together
        outputs = [request.done.result(timeout=60)[0] for request in requests]
    finally:
        engine.shutdown()
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = plain_logprobs(model, prompt, output.token_ids)
        assert output.logprobs == pytest.approx(expected, abs=1e-5)


def sample(prompt: list[int], completion: list[int]) -> TrainingSample:
    n = len(completion)
    return TrainingSample(
        prompt_ids=prompt, completion_ids=completion, completion_mask=[True] * n,
        inference_logprobs=[-1.0] * n, advantages=[1.0] * n, policy_versions=[0] * n,
        temperature=1.0, env="e",
    )  # fmt: skip


@pytest.mark.parametrize("shared_prefix", [True, False])
@pytest.mark.parametrize("lora", [False, True])
def test_trainer_rows_give_each_samples_own_logprobs_past_the_window(
    gemma_dir: Path, shared_prefix: bool, lora: bool
) -> None:
    """Two groups with prompts longer than the window, packed into shared-prefix rows (a ready
    4-D mask) or plain rows (transformers' own packed mask), each token's logprob equal to the
    sample's own forward alone; with LoRA on every default target, which Gemma 3 has."""
    model = load(gemma_dir)
    if lora:
        model = get_peft_model(model, LoraConfig(r=4, target_modules=DEFAULT_LORA_TARGETS))
        adapted = {n.split(".lora_B")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters()
                   if "lora_B" in n}  # fmt: skip
        assert adapted == set(DEFAULT_LORA_TARGETS)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(parameter, std=0.05)
    long_prompt, other_prompt = list(range(10, 10 + 3 * WINDOW)), list(range(60, 60 + WINDOW + 3))
    completions = [[70 + i % 9 for i in range(WINDOW + k)] for k in range(4)]
    samples = [sample(long_prompt, c) for c in completions[:3]] + [
        sample(other_prompt, c) for c in completions[1:]
    ]
    batch = TrainingBatch(step=1, samples=samples, max_tokens=2 * WINDOW)
    micro_batches = build_micro_batches(batch, SEQ_LEN, 8, 0, "token", shared_prefix=shared_prefix)
    found = {}
    with torch.no_grad():
        for mb in micro_batches:
            result = completion_logprobs(model, mb.packed, mb.temperature, chunk_size=5)
            where = mb.packed.loss_mask.nonzero(as_tuple=True)
            owners = mb.packed.sample_index[where].tolist()
            for owner, logprob in zip(owners, result.logprobs.tolist(), strict=True):
                found.setdefault(owner, []).append(logprob)
    assert sum(len(mb.packed.input_ids) for mb in micro_batches) < len(samples)  # packed
    for index, s in enumerate(samples):
        expected = plain_logprobs(model, s.prompt_ids, s.completion_ids)
        assert found[index] == pytest.approx(expected, abs=1e-5), index


def test_layer_types_it_cannot_mask_are_refused_by_name() -> None:
    chunked = Gemma3TextConfig(num_hidden_layers=2, layer_types=["chunked_attention"] * 2)
    with pytest.raises(UnsupportedAttentionError, match=r"layer types chunked_attention"):
        check_attention_layers(chunked, "the embedded engine")
    encoder = Gemma3TextConfig(num_hidden_layers=2, use_bidirectional_attention=True)
    with pytest.raises(UnsupportedAttentionError, match="use_bidirectional_attention"):
        check_attention_layers(encoder, "the trainer")
    check_attention_layers(Gemma3TextConfig(num_hidden_layers=2), "the trainer")
