"""The trainer trains exactly the tokens sampled in every turn of a verifiers environment's
multi-turn tool episodes, on the real model: SmolLM2-135M-Instruct, float32, on the embedded
engine. `calc-turns-v1` (`fixtures/`) plays several segments per episode, with a tool call and
a tool message in every prompt and the model's own tool calls answered by its MCP tool server;
asyncrl's renderer (the model's chat template, Hermes tool calls) bridges every turn onto the
ids sampled before it.

Each episode is one branch, one sample: no turn was tokenized again. Its model tokens are the
gate's records (`verifiers_group.exact_branch`), and the trainer's recomputed logprobs (the
trainer's own code, float32) match the engine's: mismatch KL at most 1e-6, as asyncrl's other
exactness tests hold every layout to (tests/contract/test_real_model.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.integration.verifiers.conftest import SEQ_LEN
from tests.integration.verifiers.helpers import play
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.types import TrainingBatch

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOLERANCE = 1e-4  # |Δ logprob| per token, as tests/contract/test_real_model.py measures it
ROUNDS = 3  # calc_turns_v1.ROUNDS: segments per episode


def test_trained_logprobs_are_the_engines_over_multi_turn_tool_episodes(
    smollm2_dir: Path, smollm2_server: str, verifiers_fixtures: Path
) -> None:
    played = play(
        smollm2_dir, smollm2_server, {"id": "calc-turns-v1"}, groups=2, rollouts=4,
        sampling={"max_tokens": 40, "temperature": 0.7},
    )  # fmt: skip
    assert played.pool.failures == {}, played.pool.failures
    samples = [s for g in played.groups for s in g.samples]
    assert len(samples) == 8  # one branch per episode: no turn was rendered again
    assert all(turns >= ROUNDS for g in played.groups for turns in g.turns)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    for sample in samples:
        text = tokenizer.decode(sample.prompt_ids + sample.completion_ids)
        assert "<tool_call>" in text and "<|im_start|>tool\n5<|im_end|>" in text
        assert sum(sample.completion_mask) < len(sample.completion_ids)  # env tokens are out
    calls = sum((g.tool_calls for g in played.groups), start=type(played.groups[0].tool_calls)())
    answered = played.metrics.get("orchestrator/verifiers/calc-turns-v1/metric/tool_results", 0)
    print(f"tool calls: {dict(calls)}; tool results per episode: {answered}")

    batch = TrainingBatch(1, samples, None)
    micro_batches = build_micro_batches(batch, SEQ_LEN, 4, tokenizer.pad_token_id, "token")
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ratios = [
            completion_logprobs(model, mb.packed, mb.temperature).logprobs - mb.inference_logprobs
            for mb in micro_batches
        ]
    log_ratio = torch.cat(ratios).double()
    assert log_ratio.numel() == sum(sum(s.completion_mask) for s in samples)
    mismatch_kl = float((torch.exp(log_ratio) - 1 - log_ratio).mean())
    print(f"{log_ratio.numel()} model tokens; mismatch KL {mismatch_kl:.2e}, "
          f"max |Δ logprob| {float(log_ratio.abs().max()):.2e}")  # fmt: skip
    assert mismatch_kl <= 1e-6
    assert float(log_ratio.abs().max()) <= TOLERANCE
