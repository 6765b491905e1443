"""Shared fixtures: tiny models built locally (no hub), written once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config.init_model import InitModelConfig
from asyncrl.models.init_model import init_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised Llama-shaped `tiny` model with the character tokenizer."""
    output = tmp_path_factory.mktemp("models") / "tiny-llama"
    return init_model(InitModelConfig(preset="tiny", arch="llama", output_dir=str(output)))


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("models") / "tiny-qwen2"
    return init_model(InitModelConfig(preset="tiny", arch="qwen2", output_dir=str(output)))
