"""`dtype: auto` on this machine, for the embedded engine and for external engines on CPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from asyncrl.config.inference import InferenceConfig
from asyncrl.inference.dtype import external_engine_dtype, serving_dtype
from asyncrl.precision import describe_device


@pytest.fixture
def bf16_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny model's config claiming bfloat16 weights, as most hub checkpoints do."""
    target = tmp_path / "bf16"
    shutil.copytree(tiny_model_dir, target)
    config = json.loads((target / "config.json").read_text())
    config["dtype"] = "bfloat16"
    config.pop("torch_dtype", None)
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize(("native", "expected"), [("0", torch.float32), ("1", torch.bfloat16)])
def test_auto_serves_a_bf16_checkpoint_in_bf16_only_where_native(
    bf16_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, native: str, expected: torch.dtype
) -> None:
    monkeypatch.setenv("ASYNCRL_NATIVE_BF16", native)
    describe_device.cache_clear()
    try:
        config = InferenceConfig(model=str(bf16_checkpoint))
        assert serving_dtype(config) == expected
        if not torch.cuda.is_available():  # external engines get our choice on CPU machines
            assert external_engine_dtype(config) == str(expected).removeprefix("torch.")
    finally:
        describe_device.cache_clear()


def test_an_explicit_dtype_reaches_an_external_engine_unchanged(bf16_checkpoint: Path) -> None:
    config = InferenceConfig(model=str(bf16_checkpoint), dtype="bfloat16")
    assert external_engine_dtype(config) == "bfloat16"
    assert serving_dtype(InferenceConfig(model=str(bf16_checkpoint), dtype="float32")) == (
        torch.float32
    )
