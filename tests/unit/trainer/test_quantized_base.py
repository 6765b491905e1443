"""QLoRA with an NF4 base (bitsandbytes, on this CPU): the 4-bit weights decode as the QLoRA
paper defines them, and the trainer's logprobs, gradients and update equal those of a dense
model whose base is the dequantized one — the model the servers get with
`qlora_served_base: dequantized`."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.trainer.model import load_model
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.policy_weights import policy_tensors
from asyncrl.trainer.quantized_base import (
    base_bytes,
    dense_base_bytes,
    dequantized_base,
    quantized_layers,
)
from asyncrl.trainer.train import train_step
from asyncrl.types import TrainingBatch, TrainingSample

pytestmark = pytest.mark.slow

pytest.importorskip("bitsandbytes")

# NF4: the 16 quantiles of N(0, 1) scaled to [-1, 1], Appendix E of the QLoRA paper
# (Dettmers et al., 2023), code i = the 4-bit value i
NF4 = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
])  # fmt: skip


def config(model_dir: Path, qlora: bool) -> TrainerConfig:
    return TrainerConfig(
        model=str(model_dir), lora=True, qlora_bnb=qlora, lora_rank=4, optimizer="adamw",
        recipe="fp32", learning_rate=1e-2, sequence_len=128, per_device_train_batch_size=2,
    )  # fmt: skip


def batch() -> TrainingBatch:
    rng = random.Random(3)
    samples = []
    for _ in range(6):
        completion = rng.randint(3, 12)
        samples.append(
            TrainingSample(
                prompt_ids=[rng.randrange(4, 128) for _ in range(rng.randint(4, 20))],
                completion_ids=[rng.randrange(4, 128) for _ in range(completion)],
                completion_mask=[True] * completion,
                inference_logprobs=[-4.8 + rng.uniform(-0.3, 0.3) for _ in range(completion)],
                advantages=[rng.choice((-1.0, 1.0))] * completion,
                policy_versions=[0] * completion,
                temperature=0.8,
                env="test",
            )
        )
    return TrainingBatch(step=1, samples=samples)


def qlora_and_dense(model_dir: Path, scratch: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The QLoRA model with random (non-zero) adapters, and a plain LoRA model loaded from a
    copy of the model directory whose weights are the QLoRA base dequantized, with copies of
    the same adapters."""
    torch.manual_seed(0)
    qlora = load_model(config(model_dir, qlora=True))
    with torch.no_grad():
        for name, parameter in qlora.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05)  # B starts at zero: make the adapters count
    dense_dir = scratch / "dequantized"
    shutil.copytree(model_dir, dense_dir)
    save_file(dequantized_base(qlora), str(dense_dir / "model.safetensors"))
    dense = load_model(config(dense_dir, qlora=False))
    trained = {n: p for n, p in qlora.named_parameters() if p.requires_grad}
    with torch.no_grad():
        for name, parameter in dense.named_parameters():
            if parameter.requires_grad:
                parameter.copy_(trained.pop(name))
    assert not trained
    return qlora.train(), dense.train()


def test_nf4_weights_decode_as_the_qlora_paper_defines_them(tiny_model_dir: Path) -> None:
    """An independent decoding of the stored bytes: two 4-bit codes per byte (high nibble
    first), each the NF4 value times its block's absmax; the absmaxes are stored as 8-bit
    codes of their own blocks of 256 plus the mean they were centred on (double quantization).
    It gives the weights the trainer multiplies by, and those are the original weights up to
    half the widest gap between NF4 values, per block."""
    model = load_model(config(tiny_model_dir, qlora=True))
    original = load_model(config(tiny_model_dir, qlora=False))
    originals = dict(original.named_parameters())
    served = dequantized_base(model)
    layers = quantized_layers(model)
    assert len(layers) == 4 * 7  # every Linear of the 4 decoder layers, not the head
    for path, layer in layers.items():
        state = layer.weight.quant_state
        assert (state.quant_type, state.blocksize, state.nested) == ("nf4", 64, True)
        packed = layer.weight.data.reshape(-1)
        codes = torch.stack([packed >> 4, packed & 0xF], dim=1).reshape(-1).long()
        nested = state.state2
        assert nested.blocksize == 256
        outer_block = torch.arange(state.absmax.numel()) // 256
        absmax = nested.code[state.absmax.long()] * nested.absmax[outer_block] + state.offset
        decoded = (NF4[codes].reshape(-1, 64) * absmax.reshape(-1, 1)).reshape(state.shape)
        key = path.removeprefix("base_model.model.").replace(".base_layer", "") + ".weight"
        torch.testing.assert_close(served[key], decoded, atol=1e-6, rtol=0)
        weight = originals[f"{path}.weight"].detach()
        half_gap = (NF4[1:] - NF4[:-1]).max() / 2
        blocks_absmax = weight.reshape(-1, 64).abs().amax(dim=1, keepdim=True)
        error = (decoded - weight).reshape(-1, 64).abs()
        # the absmax itself is stored in 8 bits: allow its rounding (≤ 1 %) on top
        assert (error <= blocks_absmax * (half_gap + 0.01)).all(), path


def test_qlora_logprobs_equal_a_dense_model_with_the_dequantized_base(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    qlora, dense = qlora_and_dense(tiny_model_dir, tmp_path)
    for mb in build_micro_batches(batch(), 128, 2, 0, "token"):
        with torch.no_grad():
            got = completion_logprobs(qlora, mb.packed, mb.temperature).logprobs
            expected = completion_logprobs(dense, mb.packed, mb.temperature).logprobs
        assert got.numel() > 10
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # and the base matters: the original base's logprobs are not those
    original = load_model(config(tiny_model_dir, qlora=False))
    mb = build_micro_batches(batch(), 128, 2, 0, "token")[0]
    with torch.no_grad():
        unquantized = completion_logprobs(original, mb.packed, mb.temperature).logprobs
        quantized = completion_logprobs(qlora.get_base_model(), mb.packed, mb.temperature)
    assert (unquantized - quantized.logprobs).abs().max() > 1e-4


def test_one_step_gives_the_dense_models_adapter_gradients_and_update(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    qlora, dense = qlora_and_dense(tiny_model_dir, tmp_path)
    results = []
    for model in (qlora, dense):
        train_config = config(tiny_model_dir, qlora=model is qlora)
        optimizer = build_optimizer(model, train_config)
        scheduler = build_scheduler(optimizer, train_config, 10)
        gradients: dict[str, torch.Tensor] = {}

        def capture(*_: object, model: torch.nn.Module = model, into: dict = gradients) -> None:
            for name, parameter in model.named_parameters():
                if parameter.grad is not None:
                    into[name] = parameter.grad.detach().clone()

        optimizer.register_step_pre_hook(capture)
        micro_batches = build_micro_batches(batch(), 128, 2, 0, "token")
        stats = train_step(model, None, optimizer, scheduler, micro_batches, train_config, 0)
        updated = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        results.append((gradients, updated, stats.loss))
    (q_grads, q_params, q_loss), (d_grads, d_params, d_loss) = results
    assert q_grads.keys() == d_grads.keys() == q_params.keys()
    assert len(q_grads) == 4 * 7 * 2  # lora_A and lora_B of every adapted layer
    assert all("lora_" in name for name in q_grads)
    assert max(g.abs().max() for g in q_grads.values()) > 1e-3
    assert q_loss == pytest.approx(d_loss, abs=1e-6)
    for name in q_grads:
        torch.testing.assert_close(q_grads[name], d_grads[name], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(q_params[name], d_params[name], atol=1e-6, rtol=1e-5)


def test_served_policy_tensors_are_the_dequantized_base_with_adapters_merged(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """What a colocated engine takes from a QLoRA trainer (and vLLM's whole reload): the
    dense model's weights, adapters merged, every quantized layer dequantized."""
    qlora, dense = qlora_and_dense(tiny_model_dir, tmp_path)
    served = policy_tensors(qlora, complete=True)
    expected = policy_tensors(dense, complete=True)
    assert served.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(served[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_the_nf4_base_takes_about_a_seventh_of_float32(tiny_model_dir: Path) -> None:
    model = load_model(config(tiny_model_dir, qlora=True))
    layers = quantized_layers(model)
    linear_float32 = sum(m.in_features * m.out_features * 4 for m in layers.values())
    linear_stored = sum(m.weight.numel() for m in layers.values())  # packed bytes
    assert linear_stored * 8 == linear_float32  # 4 bits per weight
    # the whole base, embeddings and norms (not quantized) included
    assert base_bytes(model) < dense_base_bytes(model) / 3
