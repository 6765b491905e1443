"""The fingerprint a server reports (`/weight_info`): of the weights themselves, and with a LoRA
adapter merged in place, of the base and the adapter combined (`served_model.merged_fingerprint`)
— the merged weights are not hashed again after every load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from asyncrl.config.inference import InferenceConfig
from asyncrl.inference.input_major import is_input_major
from asyncrl.inference.served_model import ServedModel
from asyncrl.inference.server import load_served_model
from asyncrl.transport.fingerprint import weights_fingerprint


@pytest.fixture
def served(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ServedModel]:
    config = InferenceConfig(
        model=str(tiny_model_dir), max_model_len=256, enable_lora=True, weight_roots=[str(tmp_path)]
    )
    served = load_served_model(config)
    yield served
    served.engine.shutdown()


def save_adapter(base_dir: Path, out: Path, seed: int) -> torch.nn.Module:
    """A PEFT adapter with non-zero factors; returns the merged model it stands for."""
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"],
                        init_lora_weights=False)  # fmt: skip
    adapter = get_peft_model(base, config)
    adapter.save_pretrained(out)
    return adapter.merge_and_unload()


def test_the_served_model_is_input_major_and_fingerprinted_by_its_values(
    served: ServedModel, tiny_model_dir: Path
) -> None:
    model = served.engine.model
    assert any(is_input_major(p) for p in model.parameters())  # the server's own model, on a CPU
    loaded = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert served.info().fingerprint == weights_fingerprint(loaded.named_parameters())


def test_an_adapter_changes_the_fingerprint_by_what_it_holds_and_unloading_restores_it(
    served: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    base = served.info().fingerprint
    first = save_adapter(tiny_model_dir, tmp_path / "step_1", seed=1)
    save_adapter(tiny_model_dir, tmp_path / "step_2", seed=2)

    one = served.load_lora("policy", str(tmp_path / "step_1"), False, None).fingerprint
    two = served.load_lora("policy", str(tmp_path / "step_2"), True, None).fingerprint
    one_again = served.load_lora("policy", str(tmp_path / "step_1"), True, None).fingerprint

    assert len({base, one, two}) == 3
    assert one_again == one  # the same base and adapter: the same fingerprint
    expected = dict(first.named_parameters())
    for name, parameter in served.engine.model.named_parameters():  # the weights really merged
        torch.testing.assert_close(parameter, expected[name], rtol=0, atol=1e-5)
    assert served.unload_lora("policy").fingerprint == base
