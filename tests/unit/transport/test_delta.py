"""A delta between two weights versions: XOR of each changed tensor's bits, compressed; applied
bit-exactly, and refused whole when it does not inflate to exactly its tensor."""

from __future__ import annotations

import zlib

import pytest
import torch

from asyncrl.transport.weights.delta import (
    DeltaError,
    DeltaPolicy,
    apply_delta,
    encode_delta,
    full_bytes,
    pack_delta,
    unpack_delta,
)


def versions(dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Two versions of float32 master weights a small optimizer step apart, as served."""
    torch.manual_seed(0)
    master = {"w": torch.randn(64, 32) * 0.02, "norm": torch.ones(32), "b": torch.randn(16)}
    stepped = {name: t + 1e-6 * torch.randn_like(t) for name, t in master.items()}
    stepped["norm"] = master["norm"].clone()  # a tensor the step left alone
    return (
        {name: t.to(dtype) for name, t in master.items()},
        {name: t.to(dtype) for name, t in stepped.items()},
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_delta_applied_to_its_base_gives_the_new_version_bit_for_bit(dtype: torch.dtype) -> None:
    base, new = versions(dtype)
    blobs = encode_delta(base, new, "zlib")
    assert "norm" not in blobs  # unchanged tensors are left out
    for name, blob in unpack_delta(pack_delta(blobs), "here").items():
        assert torch.equal(apply_delta(base[name], blob, "zlib"), new[name])
    laid_out = base["w"].t().contiguous().t()  # a server's input-major layout
    assert torch.equal(apply_delta(laid_out, blobs["w"], "zlib"), new["w"])


def test_bfloat16_serving_of_float32_weights_makes_a_small_delta_and_float32_a_large_one() -> None:
    served, served_next = versions(torch.bfloat16)
    small = sum(len(b) for b in encode_delta(served, served_next, "zlib").values())
    master, master_next = versions(torch.float32)
    large = sum(len(b) for b in encode_delta(master, master_next, "zlib").values())
    assert small < 0.2 * full_bytes(served_next)
    assert large > 0.5 * full_bytes(master_next)


def test_a_delta_that_does_not_inflate_to_its_tensor_is_refused() -> None:
    base, new = versions(torch.bfloat16)
    blob = encode_delta(base, new, "zlib")["w"]
    with pytest.raises(DeltaError, match="exactly"):  # cut short
        apply_delta(base["w"], blob[: len(blob) // 2], "zlib")
    bomb = zlib.compress(bytes(base["w"].numel() * 2 * 50))  # far more than the tensor
    with pytest.raises(DeltaError, match="exactly"):
        apply_delta(base["w"], bomb, "zlib")
    with pytest.raises(DeltaError, match="unknown codec"):
        apply_delta(base["w"], blob, "lzma")
    with pytest.raises(DeltaError, match="not a delta file"):
        unpack_delta(b"\x00" * 12, "here")


def test_auto_sends_deltas_only_for_a_narrower_served_dtype_and_when_they_pay() -> None:
    def policy(mode: str, served: torch.dtype) -> DeltaPolicy:
        return DeltaPolicy(mode, torch.float32, served)  # type: ignore[arg-type]

    assert policy("auto", torch.bfloat16).wanted and not policy("auto", torch.float32).wanted
    assert policy("on", torch.float32).wanted and not policy("off", torch.bfloat16).wanted
    assert policy("auto", torch.bfloat16).pays(10, 100)
    assert not policy("auto", torch.bfloat16).pays(60, 100) and policy("on", torch.float32).pays(
        60, 100
    )
