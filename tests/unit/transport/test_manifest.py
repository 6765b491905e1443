"""The manifest of a weights version: a checksum per tensor, as the trainer holds it and as the
servers serve it, read back strictly."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from asyncrl.transport.fingerprint import tensor_checksum, weights_fingerprint
from asyncrl.transport.weights.manifest import (
    DeltaBase,
    Manifest,
    WeightsMismatch,
    check_checksums,
    make_manifest,
)


def tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"a.weight": torch.randn(4, 3), "b.bias": torch.randn(3), "steps": torch.arange(3)}


def test_the_fingerprint_is_built_from_the_tensor_checksums_and_their_names() -> None:
    weights = tensors()
    manifest, served = make_manifest(7, weights)
    assert served is weights
    assert manifest.fingerprint == weights_fingerprint(weights.items())
    renamed = {f"x.{name}": tensor for name, tensor in weights.items()}
    assert weights_fingerprint(renamed.items()) != manifest.fingerprint
    assert manifest.stored["a.weight"] == tensor_checksum(weights["a.weight"].t().t())


def test_a_checksum_is_of_the_values_in_row_order_whatever_the_layout() -> None:
    weight = torch.randn(5, 6)
    input_major = weight.t().contiguous().t()  # the server's layout (`input_major.py`)
    assert tensor_checksum(input_major) == tensor_checksum(weight)


def test_the_served_dtype_is_checksummed_as_cast_and_not_when_nothing_is_cast() -> None:
    weights = tensors()
    manifest, served = make_manifest(1, weights, torch.bfloat16)
    assert served["a.weight"].dtype == torch.bfloat16 and served["steps"].dtype == torch.int64
    bf16 = manifest.checksums_at(torch.bfloat16)
    assert bf16 is not None and bf16["a.weight"] == tensor_checksum(weights["a.weight"].bfloat16())
    assert bf16["steps"] == manifest.stored["steps"]
    same, served_same = make_manifest(1, weights, torch.float32)
    assert served_same is weights and same.checksums_at("float32") == same.stored


def test_a_manifest_reads_back_and_a_tampered_one_is_refused() -> None:
    base = DeltaBase(3, "0123456789abcdef", "bfloat16", "zlib", "weights.delta")
    manifest = dataclasses.replace(make_manifest(4, tensors(), torch.bfloat16)[0], delta=base)
    assert Manifest.from_json(manifest.to_json(), "here") == manifest
    data = json.loads(manifest.to_json())
    data["stored"]["a.weight"] = "0" * 32  # its fingerprint no longer that of its tensors
    with pytest.raises(ValueError, match="here: not a valid weights manifest"):
        Manifest.from_json(json.dumps(data), "here")
    data = json.loads(manifest.to_json())
    data["delta"]["file"] = "../model.safetensors"
    with pytest.raises(ValueError, match="plain name"):
        Manifest.from_json(json.dumps(data), "here")
    with pytest.raises(ValueError, match="not a valid"):
        Manifest.from_json(b"{", "here")


def test_a_mismatch_names_the_tensors_that_differ_are_missing_or_unexpected() -> None:
    expected = {"a": "1" * 32, "b": "2" * 32, "c": "3" * 32}
    with pytest.raises(WeightsMismatch) as error:
        check_checksums(expected, {"a": "1" * 32, "b": "f" * 32, "d": "4" * 32}, "step_2")
    assert error.value.tensors == ["b", "c", "d"]
    assert "step_2" in str(error.value) and "differ: `b`" in str(error.value)
    check_checksums(expected, dict(expected), "step_2")
