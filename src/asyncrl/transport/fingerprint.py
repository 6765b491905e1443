"""Content checksums of model weights, computed the same way by every role.

A tensor's checksum is XXH3-128 over its dtype, shape and bytes in row-major order, whatever
its layout; a version's checksum ("fingerprint") is XXH3-128 over the sorted (name, tensor
checksum) pairs, first 16 hex. Being built from per-tensor checksums, a version's checksum can
be checked tensor by tensor (`manifest.py`): a server names the tensor that differs, and one
that applies a delta re-hashes only what changed.

The trainer writes them beside every version, the servers report them for what they serve, so
anyone can check that the two hold the same numbers. A content check, not a defence against
forgery: a server computes it after every weight update, where sha256 over the quick start's
38 MB took 25-45 ms of generation time each step; XXH3 takes about 2 ms. The bytes are hashed
where they lie (no copy) when the tensor is contiguous and on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:  # torch only where tensors already are: the launcher imports this module
    import torch

FINGERPRINT_HEX = 16  # a version's checksum, as markers and /weight_info give it


def tensor_checksum(tensor: torch.Tensor) -> str:
    """XXH3-128 (32 hex) over dtype, shape and the row-major bytes of `tensor`."""
    import torch  # loaded already by whoever holds the tensors

    data = tensor.detach().to("cpu").contiguous()
    digest = xxhash.xxh3_128()
    digest.update(str(data.dtype).encode())
    digest.update(str(tuple(data.shape)).encode())
    if data.numel():
        digest.update(data.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def version_checksum(checksums: Mapping[str, str]) -> str:
    """A version's checksum from its tensors' (name -> tensor checksum), 16 hex."""
    digest = xxhash.xxh3_128()
    for name in sorted(checksums):
        digest.update(f"{name}\0{checksums[name]}\n".encode())
    return digest.hexdigest()[:FINGERPRINT_HEX]


def tensor_checksums(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    return {name: tensor_checksum(tensor) for name, tensor in named_tensors}


def weights_fingerprint(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """The version checksum of these tensors as they are (their own dtype)."""
    return version_checksum(tensor_checksums(named_tensors))
