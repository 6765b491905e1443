"""The engine makes every tensor on its model's device: its KV cache, the rows it feeds the
model, sampling's temperatures and top-k/top-p bounds, seeded generators (review finding: the
KV cache and the input rows were always on the CPU, so the embedded engine could not run on a
GPU). A device stand-in does the GPU's job here: the engine thread runs with `meta` as the
default device, so anything made without `device=` lands there and mixing it with the CPU
model raises."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.inference.engine import Engine
from asyncrl.inference.sampling import SamplingParams


class EngineOnAStandInDevice(Engine):
    def _loop(self) -> None:
        with torch.device("meta"):
            super()._loop()


PARAMS = [
    SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
    SamplingParams(max_tokens=8, temperature=0.9, top_k=5, top_p=0.9, repetition_penalty=1.2,
                   min_tokens=4, seed=3, logprobs=2),
]  # fmt: skip


def generate(engine_type: type[Engine], model_dir: Path) -> list[tuple[list[int], list[float]]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = engine_type(model, AutoTokenizer.from_pretrained(model_dir), max_num_seqs=4,
                         max_model_len=128)  # fmt: skip
    try:
        outputs = []
        for params in PARAMS:
            output = engine.submit([70, 71, 72], params).done.result(timeout=60)[0]
            outputs.append((output.token_ids, output.logprobs))
        return outputs
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_the_engine_keeps_to_its_models_device_on_a_stand_in(tiny_model_dir: Path) -> None:
    on_stand_in = generate(EngineOnAStandInDevice, tiny_model_dir)
    plain = generate(Engine, tiny_model_dir)
    assert all(len(tokens) == 8 for tokens, _ in plain)
    assert on_stand_in == plain
