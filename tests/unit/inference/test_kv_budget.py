"""The embedded server's KV cache budget: a model whose own context is long (SmolLM2: 8,192
positions, 377 MB a slot in float32) gets as many slots as fit, not an allocation of 96 GB."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from asyncrl.config.base import ConfigError
from asyncrl.config.inference import InferenceConfig
from asyncrl.inference.kv_cache import slot_bytes
from asyncrl.inference.server import slots_that_fit

SMOLLM2 = SimpleNamespace(
    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576,
    head_dim=64,
)  # fmt: skip


def test_a_slot_holds_keys_and_values_of_every_layer() -> None:
    assert slot_bytes(SMOLLM2, 8192, torch.float32) == 2 * 30 * 3 * 8192 * 64 * 4  # 377 MB


def test_max_num_seqs_is_lowered_to_the_slots_that_fit(caplog: pytest.LogCaptureFixture) -> None:
    per_slot = slot_bytes(SMOLLM2, 8192, torch.float32)
    config = InferenceConfig(model="m", max_num_seqs=256, kv_cache_memory_bytes=10 * per_slot + 1)
    model = SimpleNamespace(config=SMOLLM2)
    assert slots_that_fit(config, model, 8192, torch.float32) == 10  # type: ignore[arg-type]
    assert "max_num_seqs 256 lowered to 10" in caplog.text
    roomy = config.model_copy(update={"kv_cache_memory_bytes": 1 << 40})
    assert slots_that_fit(roomy, model, 8192, torch.float32) == 256  # type: ignore[arg-type]


def test_a_budget_below_one_slot_is_refused_with_what_to_change() -> None:
    config = InferenceConfig(model="m", kv_cache_memory_bytes=1 << 20)
    model = SimpleNamespace(config=SMOLLM2)
    with pytest.raises(ConfigError, match="lower `max_model_len` or raise `kv_cache_memory_bytes`"):
        slots_that_fit(config, model, 8192, torch.float32)  # type: ignore[arg-type]
