"""QLoRA under the multi-rank trainer: FSDP2 shards the NF4 base's packed codes like any frozen
parameter (bitsandbytes keeps each layer's quantization state on the module and restores it
on the gathered weight), and 2 gloo ranks compute what one process does — the adapters'
gradient and update, the dequantized base the servers are given, the adapter broadcast — and a
checkpoint written on 2 ranks resumes on 1."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from .test_parallel import HERE, assert_same, run_ranks

pytestmark = [pytest.mark.integration, pytest.mark.slow]

pytest.importorskip("bitsandbytes")

SCRIPT = HERE / "parallel_qlora.py"


def test_two_ranks_train_a_qlora_model_as_one_and_resume_on_one(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    run_ranks(tiny_model_dir, one, 1, SCRIPT, tmp_path / "ckpt1", "run")
    run_ranks(tiny_model_dir, two, 2, SCRIPT, tmp_path / "ckpt2", "run")
    single, double = load_file(one / "run.safetensors"), load_file(two / "run.safetensors")
    assert single.keys() == double.keys()
    gradients = [key for key in single if key.startswith("grad/")]
    assert gradients and all(".lora_" in key for key in gradients)  # the base stays frozen
    assert any(single[key].abs().max() > 1e-4 for key in gradients)
    assert sum(key.startswith("base/") for key in single) > 28  # the 28 quantized layers, +
    assert sum(key.startswith("adapter/") for key in single) == len(gradients)
    for key in single:
        assert_same(double[key], single[key], key)

    resumed = tmp_path / "resumed"
    run_ranks(tiny_model_dir, resumed, 1, SCRIPT, tmp_path / "ckpt2", "resume")
    after = load_file(resumed / "resume.safetensors")
    assert after
    for key, value in after.items():
        torch.testing.assert_close(value, single[key.replace("param/", "step2/")], atol=1e-5,
                                   rtol=0, msg=key)  # fmt: skip
