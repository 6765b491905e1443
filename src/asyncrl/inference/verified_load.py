"""A weights version read, checked against the trainer's manifest and staged for the engine,
off the engine's thread: nothing unchecked is ever installed.

A full version is read into this process's memory (`weights.read_safetensors_dir`), checked
against the manifest as the trainer wrote it (every bit of the files), converted to the dtype
the server serves, and checked again at that dtype where the manifest covers it — the values
served, after conversion; where it does not, the checksums of the conversion become the
server's own. A delta (`transport/weights/delta.py`) is applied to the weights the server holds
only when they are its base (step and checksum, checked by the caller under its load lock); the
tensors it changes are re-hashed and the whole version compared with the manifest.

The staged tensors are in each parameter's dtype and layout and belong to the engine
(`install(..., take=True)` makes them its storage), so after the swap the server serves
exactly the memory it checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from asyncrl.inference.input_major import like_parameter
from asyncrl.inference.weights import (
    UnreadableWeights,
    files_bytes,
    read_full_weights,
    read_safetensors_dir,
)
from asyncrl.transport.fingerprint import tensor_checksum, tensor_checksums, version_checksum
from asyncrl.transport.weights.delta import DeltaError, apply_delta, read_delta_file
from asyncrl.transport.weights.manifest import (
    MANIFEST_FILE,
    Manifest,
    WeightsMismatch,
    cast,
    check_checksums,
    dtype_name,
    read_manifest,
)


@dataclass(frozen=True)
class Staged:
    tensors: dict[str, torch.Tensor]  # parameter name -> its new storage
    checksums: dict[str, str]  # of every weight as served after the swap (the served dtype)
    fingerprint: str  # the version's, as the trainer gives it (of the files without a manifest)
    verified: bool  # checked against the trainer's manifest
    kind: Literal["full", "delta"]
    bytes_read: int


def own_storage(staged: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """`staged`, or a copy when it still is `source` (read-only file bytes, or a tensor the
    caller keeps)."""
    return staged.clone() if staged.data_ptr() == source.data_ptr() else staged


def stage_full(
    model: torch.nn.Module, directory: Path, roots: list[str], manifest: Manifest | None
) -> Staged:
    """Read a full version and check it; `WeightsMismatch` names the tensors that differ."""
    source = read_full_weights(model, directory, roots)
    parameters = dict(model.named_parameters())
    served_dtype = next(iter(parameters.values())).dtype
    converted, checksums, fingerprint = converted_and_checked(
        source, manifest, served_dtype, str(directory)
    )
    staged = {
        name: own_storage(like_parameter(tensor, parameters[name]), source[name])
        for name, tensor in converted.items()
    }
    read = files_bytes(directory)
    if manifest is not None:
        read += (directory / MANIFEST_FILE).stat().st_size
    return Staged(staged, checksums, fingerprint, manifest is not None, "full", read)


def converted_and_checked(
    source: dict[str, torch.Tensor], manifest: Manifest | None, dtype: torch.dtype, where: str
) -> tuple[dict[str, torch.Tensor], dict[str, str], str]:
    """The tensors read (`source`) converted to the served `dtype`, their checksums, and the
    version's fingerprint, checked against the manifest: as the trainer wrote them (any bit of
    the files), and, where the manifest covers the served dtype, as served after conversion
    (where it does not, the conversion's checksums become the server's own). Without a
    manifest nothing is checked."""
    converted = {name: cast(tensor, dtype) for name, tensor in source.items()}
    checksums = tensor_checksums(converted.items())
    same = all(converted[name] is tensor for name, tensor in source.items())
    as_read = checksums if same else tensor_checksums(source.items())
    if manifest is None:
        return converted, checksums, version_checksum(as_read)
    what = f"{where} (version {manifest.step})"
    check_checksums(manifest.stored, as_read, what)
    expected = manifest.checksums_at(dtype)
    if expected is not None and not same:
        check_checksums(expected, checksums, f"{what}, as served in {dtype_name(dtype)}")
    return converted, checksums, manifest.fingerprint


@dataclass(frozen=True)
class Checked:
    """A version's files as an engine that loads them itself (vLLM) gets them: read, converted
    and checked here, then handed over as tensors in Hugging Face names."""

    tensors: dict[str, torch.Tensor]
    verified: str | None  # the trainer's fingerprint they were checked against
    reloads: int  # 1 when they were read once more
    bytes_read: int


def read_checked(directory: Path, roots: list[str], dtype: torch.dtype) -> Checked:
    """Read a version's files, convert them to `dtype` and check them against the manifest
    beside them, once more when they do not check; `WeightsMismatch` or `UnreadableWeights`
    when they still do not."""
    manifest = manifest_of(directory)
    for attempt in range(2):
        try:
            source = read_safetensors_dir(directory, roots)
            converted, _, _ = converted_and_checked(source, manifest, dtype, str(directory))
        except (WeightsMismatch, UnreadableWeights):
            if manifest is None or attempt:
                raise
            continue
        verified = manifest.fingerprint if manifest is not None else None
        return Checked(converted, verified, attempt, files_bytes(directory))
    raise AssertionError("unreachable")


def stage_delta(
    model: torch.nn.Module, directory: Path, manifest: Manifest, held: Mapping[str, str]
) -> Staged:
    """The version `manifest` describes, from the weights the server holds (its base, whose
    checksums are `held`) and the delta file beside it."""
    base = manifest.delta
    assert base is not None, "a delta version"
    path = directory / base.file
    blobs = read_delta_file(path)
    read = path.stat().st_size + (directory / MANIFEST_FILE).stat().st_size
    return stage_delta_blobs(model, str(path), manifest, held, blobs, read)


def stage_delta_blobs(
    model: torch.nn.Module,
    where: str,
    manifest: Manifest,
    held: Mapping[str, str],
    blobs: Mapping[str, bytes],
    bytes_read: int,
) -> Staged:
    """The version `manifest` describes from its base's weights (the model's, of checksums
    `held`) and a delta's blobs (read from a file, or received): `DeltaError` for a delta that
    does not decode, `WeightsMismatch` for a result that is not the trainer's."""
    base = manifest.delta
    assert base is not None, "a delta version"
    expected = manifest.checksums_at(base.dtype)
    if expected is None:
        raise DeltaError(f"{where}: its manifest has no {base.dtype} checksums")
    parameters = dict(model.named_parameters())
    unknown = [name for name in blobs if name not in parameters]
    if unknown:
        raise DeltaError(f"{where}: changes {unknown[:3]}, which this model does not have")
    checksums = dict(held)
    staged: dict[str, torch.Tensor] = {}
    for name, blob in blobs.items():
        parameter = parameters[name]
        new = apply_delta(parameter.detach(), blob, base.codec)  # fresh memory
        checksums[name] = tensor_checksum(new)
        staged[name] = like_parameter(new, parameter)
    check_checksums(expected, checksums, f"{where} applied to version {base.step}")
    return Staged(staged, checksums, manifest.fingerprint, True, "delta", bytes_read)


def installed_mismatches(model: torch.nn.Module, staged: Staged) -> list[str]:
    """After the swap, on the engine's thread: the parameters that are not the staged memory
    (copied rather than taken) and whose values are not what was checked."""
    parameters = dict(model.named_parameters())
    wrong = []
    for name, tensor in staged.tensors.items():
        parameter = parameters[name]
        if parameter.data_ptr() == tensor.data_ptr():
            continue
        if tensor_checksum(parameter) != staged.checksums[name]:
            wrong.append(name)
    return wrong


def manifest_of(directory: Path) -> Manifest | None:
    try:
        return read_manifest(directory)
    except ValueError as error:  # a manifest that does not parse: the version is not whole
        raise UnreadableWeights(str(error)) from error


def copies_that_differ(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of `tensors` copied into a parameter (not shared with it) whose parameter does not
    now hold their values (in its dtype). A name that is not a parameter (vLLM's own model,
    whose weights are fused) is vLLM's loader's to check."""
    parameters = dict(model.named_parameters())
    wrong = []
    with torch.no_grad():
        for name, tensor in tensors.items():
            parameter = parameters.get(name)
            if parameter is None or parameter.data_ptr() == tensor.data_ptr():
                continue
            if not torch.equal(parameter, tensor.to(parameter.device, parameter.dtype)):
                wrong.append(name)
    return wrong
