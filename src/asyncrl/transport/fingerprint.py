"""A content fingerprint of model weights, computed the same way by every role.

The trainer writes it beside a broadcast and the inference server reports it for the weights it
serves, so anyone can check that the two hold the same numbers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


def weights_fingerprint(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor, in name order; first 16 hex."""
    digest = hashlib.sha256()
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        data = tensor.detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(str(data.dtype).encode())
        digest.update(str(tuple(data.shape)).encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()[:16]
