"""A content fingerprint of model weights, computed the same way by every role.

The trainer writes it beside a broadcast and the inference server reports it for the weights it
serves, so anyone can check that the two hold the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:  # torch only where tensors already are: the launcher imports this module
    import torch


def weights_fingerprint(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """XXH3-128 over (name, dtype, shape, bytes) of every tensor, in name order; first 16 hex.

    A content check, not a defence against forgery: a server computes it on its engine's
    thread after every weight update, where sha256 over the quick start's 38 MB took 25-45 ms
    of generation time each step; XXH3 takes about 2 ms. The bytes are hashed where they lie
    (no copy)."""
    import torch  # loaded already by whoever holds the tensors

    digest = xxhash.xxh3_128()
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        data = tensor.detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(str(data.dtype).encode())
        digest.update(str(tuple(data.shape)).encode())
        if data.numel():
            digest.update(data.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()[:16]
