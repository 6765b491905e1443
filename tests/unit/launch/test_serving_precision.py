"""Under `asyncrl rl`, an engine left at `dtype: auto` serves in the trainer's precision."""

from __future__ import annotations

import pytest

from asyncrl import precision
from asyncrl.config.rl import RLConfig
from asyncrl.launch import serving_precision
from asyncrl.precision import DeviceReport, PrecisionChoice


def config(**inference: object) -> RLConfig:
    return RLConfig(
        model="m", deployment="colocated", inference=inference, orchestrator={}, trainer={}
    )


@pytest.mark.parametrize(("native", "expected"), [(True, "bfloat16"), (False, "auto")])
def test_auto_follows_the_recipe_the_device_gets(
    monkeypatch: pytest.MonkeyPatch, native: bool, expected: str
) -> None:
    device = DeviceReport("cpu", "a CPU", native, "a probe")
    recipe = "bf16" if native else "fp32"
    monkeypatch.setattr(
        precision, "resolve_recipe",
        lambda requested: PrecisionChoice(recipe, requested, "probed", device),  # type: ignore[arg-type]
    )  # fmt: skip
    resolved = serving_precision.serve_in_training_precision(config())
    assert resolved.inference.dtype == expected
    assert resolved.trainer.colocated_inference is not None
    assert resolved.trainer.colocated_inference.dtype == expected  # the engine it hosts
    assert resolved.trainer.recipe == "auto"  # the trainer still decides (and logs why)
    explicit = serving_precision.serve_in_training_precision(config(dtype="float32"))
    assert explicit.inference.dtype == "float32"
