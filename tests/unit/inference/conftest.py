"""An in-process engine on the tiny model, started and shut down per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.inference.engine import Engine


@pytest.fixture
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = Engine(model, tokenizer, max_num_seqs=8, max_model_len=512)
    yield engine
    engine.shutdown()
