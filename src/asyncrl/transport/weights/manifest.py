"""What a weights version holds, tensor by tensor: the trainer's word against which every server
checks what it loaded (`MANIFEST.json` in a broadcast directory, or sent beside the tensors).

For each tensor the manifest gives its checksum (`fingerprint.tensor_checksum`) as the trainer
holds it (`stored`), and, for the dtype the servers are expected to serve in, of the tensor cast
to it (`served`): a server that converts float32 master weights to bfloat16 checks the very
values it serves, not the file it read. A server that serves a dtype the manifest does not
cover checks what it read against `stored`, then that its own weights are those values cast
(it hashes them, and keeps those checksums for deltas).

A delta version (`delta.py`) also names its base: the step and the version checksum (at the
delta's dtype) a server must hold for the delta to apply. The version's fingerprint, as
`STABLE` and `/weight_info` give it, is the version checksum of `stored`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.transport.fingerprint import tensor_checksums, version_checksum

if TYPE_CHECKING:
    import torch

MANIFEST_FILE = "MANIFEST.json"  # in broadcasts/step_N/, written before STABLE
FORMAT = 1
HASH = "xxh3-128"
NAMED_IN_ERRORS = 3  # tensors an error names at most
_HEX = re.compile(r"^[0-9a-f]{16,32}$")


class WeightsMismatch(ValueError):
    """Weights that are not what the trainer says they are; the message names the tensors."""

    def __init__(self, message: str, tensors: list[str]) -> None:
        super().__init__(message)
        self.tensors = tensors


@dataclass(frozen=True)
class DeltaBase:
    """What a delta applies to: weights version `step`, of version checksum `checksum` at
    `dtype` (the server's own checksums of what it holds)."""

    step: int
    checksum: str
    dtype: str
    codec: str  # how each changed tensor's XOR is compressed: zstd or zlib
    file: str  # the delta's file in the broadcast directory


@dataclass(frozen=True)
class Manifest:
    step: int
    stored: dict[str, str]  # tensor name -> checksum, as the trainer holds it
    served: dict[str, dict[str, str]] = field(default_factory=dict)  # dtype -> name -> checksum
    delta: DeltaBase | None = None

    @property
    def fingerprint(self) -> str:
        return version_checksum(self.stored)

    def checksums_at(self, dtype: torch.dtype | str) -> dict[str, str] | None:
        """The tensors' checksums cast to `dtype`, if the manifest covers it."""
        return self.served.get(dtype_name(dtype))

    def to_json(self) -> bytes:
        data: dict[str, Any] = {
            "format": FORMAT, "hash": HASH, "step": self.step, "fingerprint": self.fingerprint,
            "stored": self.stored, "served": self.served,
            "delta": None if self.delta is None else vars(self.delta),
        }  # fmt: skip
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str, where: str) -> Manifest:
        """Parse and check a manifest; `ValueError` naming `where` for anything malformed."""
        try:
            data = json.loads(raw)
            if data.get("format") != FORMAT or data.get("hash") != HASH:
                raise ValueError(f"format {data.get('format')!r}, hash {data.get('hash')!r}")
            delta = data.get("delta")
            manifest = cls(
                step=_integer(data["step"]),
                stored=_checksums(data["stored"]),
                served={str(k): _checksums(v) for k, v in dict(data.get("served", {})).items()},
                delta=None if delta is None else _delta(delta),
            )
            if data.get("fingerprint") != manifest.fingerprint:
                raise ValueError("its fingerprint is not that of its tensors")
        except (TypeError, KeyError, AttributeError, json.JSONDecodeError, ValueError) as error:
            raise ValueError(f"{where}: not a valid weights manifest ({error})") from error
        return manifest


def _integer(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a step")
    return value


def _checksums(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and _HEX.match(v) for k, v in value.items()
    ):
        raise ValueError("checksums must map tensor names to hex digests")
    return dict(value)


def _delta(value: Any) -> DeltaBase:
    base = DeltaBase(
        step=_integer(value["step"]), checksum=str(value["checksum"]), dtype=str(value["dtype"]),
        codec=str(value["codec"]), file=str(value["file"]),
    )  # fmt: skip
    if not _HEX.match(base.checksum):
        raise ValueError(f"delta base checksum {base.checksum!r} is not a hex digest")
    if "/" in base.file or base.file.startswith("."):
        raise ValueError(f"delta file {base.file!r} must be a plain name")
    return base


def dtype_name(dtype: torch.dtype | str) -> str:
    return str(dtype).removeprefix("torch.")


def cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor` as a server serving `dtype` holds it: floating-point tensors converted."""
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def make_manifest(
    step: int,
    tensors: Mapping[str, torch.Tensor],
    served_dtype: torch.dtype | None = None,
    delta: DeltaBase | None = None,
) -> tuple[Manifest, Mapping[str, torch.Tensor]]:
    """The manifest of `tensors` (as the trainer holds them) and, with `served_dtype`, of the
    same tensors cast to it; returns it with the served tensors (`tensors` themselves where
    nothing needed a cast: their checksums are then hashed once)."""
    stored = tensor_checksums(tensors.items())
    if served_dtype is None:
        return Manifest(step, stored, {}, delta), tensors
    if all(t.dtype == served_dtype or not t.is_floating_point() for t in tensors.values()):
        return Manifest(step, stored, {dtype_name(served_dtype): stored}, delta), tensors
    served = {name: cast(tensor, served_dtype) for name, tensor in tensors.items()}
    served_checksums = {dtype_name(served_dtype): tensor_checksums(served.items())}
    return Manifest(step, stored, served_checksums, delta), served


def check_checksums(expected: Mapping[str, str], actual: Mapping[str, str], what: str) -> None:
    """Raise `WeightsMismatch` naming the first tensors that are missing, unexpected or
    different in `actual`."""
    missing = [name for name in expected if name not in actual]
    unexpected = [name for name in actual if name not in expected]
    different = [name for name in expected if name in actual and actual[name] != expected[name]]
    if not (missing or unexpected or different):
        return
    parts = []
    for label, names in (("differ", different), ("missing", missing), ("unexpected", unexpected)):
        if names:
            shown = ", ".join(f"`{n}`" for n in names[:NAMED_IN_ERRORS])
            more = (
                f" and {len(names) - NAMED_IN_ERRORS} more" if len(names) > NAMED_IN_ERRORS else ""
            )
            parts.append(f"{label}: {shown}{more}")
    raise WeightsMismatch(
        f"{what}: not the trainer's weights ({'; '.join(parts)})", different + missing + unexpected
    )


def write_manifest(directory: Path, manifest: Manifest) -> None:
    from asyncrl.fs import atomic_write_bytes

    atomic_write_bytes(directory / MANIFEST_FILE, manifest.to_json())


def read_manifest(directory: Path) -> Manifest | None:
    """The directory's manifest, None where it has none (weights not made by a trainer, or by
    one from before manifests)."""
    path = directory / MANIFEST_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return Manifest.from_json(raw, str(path))
