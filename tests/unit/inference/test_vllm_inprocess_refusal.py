"""A colocated vLLM trainer started from an interpreter without vLLM (`inference.executable`
unset) stops with a configuration error that says what to set, not an ImportError."""

from __future__ import annotations

import importlib.util

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.inference import InferenceConfig
from asyncrl.inference.vllm_inprocess import VllmInprocessEngine


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is importable here")
def test_without_vllm_the_error_names_inference_executable() -> None:
    config = InferenceConfig(model="m", backend="vllm")
    with pytest.raises(ConfigError, match=r"`inference\.executable`"):
        VllmInprocessEngine(config)
