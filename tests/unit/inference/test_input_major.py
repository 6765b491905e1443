"""Linear weights kept input-major for CPU decode passes (`inference/input_major.py`): the same
model to float rounding, and every way weights reach the engine keeps the layout and the values."""

from __future__ import annotations

from pathlib import Path

import torch
from tests.unit.inference.test_lora_merge import merged_reference, two_layer_model, write_adapter
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.inference.engine import Engine
from asyncrl.inference.input_major import is_input_major, lay_out_input_major, like_parameter
from asyncrl.inference.sampling import SamplingParams
from asyncrl.inference.served_model import ServedModel
from asyncrl.inference.weights import apply_lora, read_lora_adapter
from asyncrl.transport.fingerprint import weights_fingerprint


def load(directory: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)


def linear_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    head = model.get_output_embeddings()
    return {
        f"{name}.weight": module.weight
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not head
    }


def test_every_linear_but_the_head_is_laid_out_and_keeps_its_values(tiny_model_dir: Path) -> None:
    plain, laid_out = load(tiny_model_dir), load(tiny_model_dir)
    parameter_objects = [id(p) for p in laid_out.parameters()]

    changed = lay_out_input_major(laid_out)

    linears = linear_weights(laid_out)
    assert changed == len(linears) > 0
    assert all(is_input_major(weight) for weight in linears.values())
    assert laid_out.get_output_embeddings().weight.is_contiguous()
    assert [id(p) for p in laid_out.parameters()] == parameter_objects  # the same parameters
    before = dict(plain.named_parameters())
    for name, parameter in laid_out.named_parameters():
        assert torch.equal(parameter, before[name])
    assert weights_fingerprint(laid_out.named_parameters()) == weights_fingerprint(
        plain.named_parameters()
    )  # the fingerprint reads values, not memory
    ids = torch.randint(
        0, plain.config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        expected, got = plain(ids).logits, laid_out(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert lay_out_input_major(laid_out) == 0  # once is enough


def test_weights_in_another_dtype_keep_their_layout(tiny_model_dir: Path) -> None:
    model = load(tiny_model_dir, torch.bfloat16)  # measured no faster input-major

    assert lay_out_input_major(model) == 0
    assert all(weight.is_contiguous() for weight in linear_weights(model).values())


def test_a_full_update_from_disk_lands_in_the_layout(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`update_weights` hands the engine its staged tensors to keep as storage: staged in the
    weight's layout, they keep it, and the decode passes then use the new values."""
    model = load(tiny_model_dir)
    lay_out_input_major(model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = Engine(model, tokenizer, max_num_seqs=4, max_model_len=64)
    served = ServedModel(engine, "tiny", [str(tmp_path)], enable_lora=False, max_lora_rank=None)
    try:
        trained = load(tiny_model_dir)
        with torch.no_grad():
            for parameter in trained.parameters():
                parameter.mul_(1.5)
        trained.save_pretrained(tmp_path / "step_3")

        info = served.update_weights(str(tmp_path / "step_3"), None)

        assert info.version == 3
        assert info.fingerprint == weights_fingerprint(trained.named_parameters())
        assert all(is_input_major(weight) for weight in linear_weights(model).values())
        expected = dict(trained.named_parameters())
        for name, parameter in model.named_parameters():
            assert torch.equal(parameter, expected[name])
        params = SamplingParams(max_tokens=4, temperature=0.0, logprobs=0)
        (output,) = engine.submit([5, 6, 7], params).done.result(timeout=60)
        ids = torch.tensor([[5, 6, 7, *output.token_ids]])
        with torch.no_grad():
            logits = trained(ids).logits[0, 2:-1]
        assert output.token_ids == logits.argmax(-1).tolist()  # decoded with the new weights
    finally:
        engine.shutdown()


def test_staging_follows_the_parameter() -> None:
    weight = torch.randn(5, 3).t().contiguous().t()  # input-major [5, 3]
    incoming = torch.randn(5, 3, dtype=torch.float64)

    staged = like_parameter(incoming, weight)

    assert staged.stride() == weight.stride() and staged.dtype == torch.float32
    assert torch.equal(staged, incoming.float())
    plain = torch.randn(5, 3)
    assert like_parameter(incoming, plain).stride() == plain.stride()


def test_a_lora_merge_writes_through_the_layout(tmp_path: Path) -> None:
    """`addmm(..., out=parameter)` into an input-major weight, on a kept base of the same layout
    (a clone keeps it): base + scale · B·A as computed independently, and a reload replaces it."""
    model = two_layer_model(torch.float32)
    assert lay_out_input_major(model) == 2
    base = {name: p.detach().clone() for name, p in model.named_parameters()}
    for seed in (1, 2):
        factors = write_adapter(tmp_path / f"step_{seed}", seed)
        adapter = read_lora_adapter("a", tmp_path / f"step_{seed}", model, [str(tmp_path)])

        apply_lora(model, base, adapter)

        for name, parameter in model.named_parameters():
            assert is_input_major(parameter)
            expected = merged_reference(base[name], factors[name])
            torch.testing.assert_close(parameter.double(), expected, rtol=0, atol=1e-5)
