"""A weights version as what changed since a base version: per tensor, the XOR of its bits
with the base's, compressed; tensors that did not change are left out.

Why XOR and not differences: a server applies it bit-exactly whatever the dtype (no rounding),
and where a value did not change its XOR is zero, which compresses to almost nothing. What pays
is a served dtype narrower than the trainer's: bfloat16 serving of float32 master weights sees
only the values whose bfloat16 rounding moved (a few percent a step at RL learning rates),
while float32 serving sees every value change every step and the delta is as large as the
version itself (`auto` then sends the full version: `DeltaPolicy`).

Compression is zstd where the `zstandard` package is installed, else zlib (level 1: the zeros
are what compress, and speed matters more than the last percent). A delta names its codec; a
decoder refuses a blob that does not inflate to exactly the tensor's size.

On disk a delta is a safetensors file of uint8 blobs, one per changed tensor (`weights.delta`,
not `*.safetensors`: nothing that loads models mistakes it for one).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

DELTA_FILE = "weights.delta"
Codec = Literal["zstd", "zlib"]
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # itemsize -> int view
PAYS_BELOW = 0.5  # `auto` sends a delta only when it is under this fraction of the full bytes


class DeltaError(ValueError):
    """A delta that cannot be decoded (corrupt, truncated, an unknown codec)."""


class DeltaRefused(ValueError):
    """A delta sent to a server that does not hold its base: it needs the full version."""


def default_codec() -> Codec:
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return "zlib"
    return "zstd"


def _compress(data: memoryview, codec: Codec) -> bytes:
    if codec == "zstd":
        import zstandard

        return bytes(zstandard.ZstdCompressor(level=1).compress(data))
    return zlib.compress(data, 1)


def _decompress(blob: bytes, size: int, codec: str) -> bytes:
    """`blob` inflated; exactly `size` bytes or `DeltaError` (never more: a bomb stops here)."""
    if codec == "zstd":
        try:
            import zstandard
        except ImportError as error:
            raise DeltaError("the delta is zstd-compressed; install `zstandard`") from error
        try:
            out = zstandard.ZstdDecompressor().decompress(blob, max_output_size=size)
        except zstandard.ZstdError as error:
            raise DeltaError(f"not a zstd stream ({error})") from error
    elif codec == "zlib":
        inflater = zlib.decompressobj()
        try:
            out = inflater.decompress(blob, size)
        except zlib.error as error:
            raise DeltaError(f"not a zlib stream ({error})") from error
        if not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
            raise DeltaError(f"does not inflate to exactly {size} bytes")
    else:
        raise DeltaError(f"unknown codec {codec!r}")
    if len(out) != size:
        raise DeltaError(f"inflates to {len(out)} bytes, not {size}")
    return out


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s bits as integers of its width, row-major: [numel]."""
    return tensor.detach().contiguous().reshape(-1).view(BITS[tensor.element_size()])


def encode_delta(
    base: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor], codec: Codec
) -> dict[str, bytes]:
    """name -> compressed XOR of `new` with `base`, for the tensors that changed (the same
    names, shapes and dtypes in both)."""
    blobs: dict[str, bytes] = {}
    for name, tensor in new.items():
        old = base[name]
        if (old.shape, old.dtype) != (tensor.shape, tensor.dtype):
            raise ValueError(f"`{name}`: the base is {old.dtype} {tuple(old.shape)}")
        xor = torch.bitwise_xor(_bits(old), _bits(tensor))
        if not bool(xor.any()):
            continue
        blobs[name] = _compress(memoryview(xor.numpy()).cast("B"), codec)
    return blobs


def apply_delta(base: torch.Tensor, blob: bytes, codec: str) -> torch.Tensor:
    """A new tensor: `base` (any layout) with the XOR in `blob` applied, contiguous."""
    size = base.numel() * base.element_size()
    xor = torch.frombuffer(
        bytearray(_decompress(blob, size, codec)), dtype=BITS[base.element_size()]
    )
    return torch.bitwise_xor(_bits(base), xor).view(base.dtype).reshape(base.shape)


def delta_bytes(blobs: Mapping[str, bytes]) -> int:
    return sum(len(blob) for blob in blobs.values())


def full_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def pack_delta(blobs: Mapping[str, bytes]) -> bytes:
    """The delta file's bytes: a safetensors file of one uint8 blob per changed tensor."""
    tensors = {
        name: torch.frombuffer(bytearray(blob), dtype=torch.uint8) for name, blob in blobs.items()
    }
    return bytes(save_safetensors(tensors, metadata={"format": "asyncrl-delta"}))


def unpack_delta(data: bytes, where: str) -> dict[str, bytes]:
    try:
        tensors = load_safetensors(data)
    except (SafetensorError, ValueError, RuntimeError) as error:
        raise DeltaError(f"{where}: not a delta file ({error})") from error
    return {name: tensor.numpy().tobytes() for name, tensor in tensors.items()}


def read_delta_file(path: Path) -> dict[str, bytes]:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DeltaError(f"{path}: cannot read ({error})") from error
    return unpack_delta(data, str(path))


@dataclass(frozen=True)
class Written:
    """The version a sender last sent, as the servers hold it: the base of its next delta."""

    step: int
    served: dict[str, torch.Tensor]  # every tensor at the served dtype (a copy of its own)
    checksum: str  # the version checksum of `served`


@dataclass(frozen=True)
class DeltaPolicy:
    """When a version travels as a delta. `off`: never; `on`: whenever the receivers hold the
    base; `auto`: when the served dtype is narrower than the trainer's (bfloat16 serving of
    float32 weights) and the delta is under PAYS_BELOW of the full version's bytes."""

    mode: Literal["auto", "on", "off"]
    trainer_dtype: torch.dtype
    served_dtype: torch.dtype

    @property
    def wanted(self) -> bool:
        if self.mode == "off":
            return False
        return self.mode == "on" or self.served_dtype.itemsize < self.trainer_dtype.itemsize

    def pays(self, delta: int, full: int) -> bool:
        return self.mode == "on" or delta < PAYS_BELOW * full
