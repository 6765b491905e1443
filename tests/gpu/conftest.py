"""The model the GPU check runs: SmolLM2-135M-Instruct's shape and tokenizer, with its real
weights where they are at hand."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[2]
# `asyncrl get-model`'s default place in a checkout (`make smollm2`)
CHECKOUT_MODEL = REPO / "models" / "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def gpu_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`ASYNCRL_GPU_MODEL` or the checkout's SmolLM2 folder. A folder with weights is used as it
    is; one with only its config and tokenizer files (what fits the 64 MiB a lent device machine
    receives) becomes a model of that shape with random weights, said in the test output."""
    folder = Path(os.environ.get("ASYNCRL_GPU_MODEL", CHECKOUT_MODEL))
    if not (folder / "config.json").exists():
        pytest.skip(f"no model at {folder}: run `make smollm2` or set ASYNCRL_GPU_MODEL")
    if any(folder.glob("*.safetensors")):
        print(f"\nGPU check model: {folder} (its own weights)")
        return folder
    output = tmp_path_factory.mktemp("models") / folder.name
    shutil.copytree(folder, output)
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(folder)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(output)
    print(f"\nGPU check model: {folder.name}'s shape and tokenizer, random weights")
    return output
