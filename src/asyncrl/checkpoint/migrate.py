"""`asyncrl migrate-checkpoint PATH...`: convert trainer checkpoints of earlier asyncrl versions,
whose index and optimizer values are pickles, into the format that holds none.

A run never does this by itself: resuming refuses a pickled checkpoint, and its owner converts
it once, deliberately, having decided to trust it. Even then nothing in it runs: DCP's
`.metadata` is read by an unpickler that knows only DCP's own metadata records, torch sizes,
dtypes and layouts and `pathlib` paths (anything else stops the conversion, naming it), and
the tensors, byte items and `rank_<r>.pt` files with `torch.load(weights_only=True)`. The
whole state is assembled in this one process (the shards of every rank, whole tensors) and
written in the new format, which any number of ranks resumes; the directory is replaced
atomically and keeps its COMPLETE marker.

PATH is a trainer checkpoint (`checkpoints/step_N/trainer`) or any folder holding some (a run
directory, its `checkpoints/`); every pickled checkpoint under it is converted.
"""

from __future__ import annotations

import io
import itertools
import pickle
import shutil
import sys
from pathlib import Path, PosixPath, PurePosixPath
from typing import Any

import torch
import torch.serialization
from torch.distributed.checkpoint import metadata as dcp_metadata

from asyncrl.checkpoint.plain_values import CheckpointRefused
from asyncrl.checkpoint.state_files import (
    PICKLED_METADATA,
    SHARDS,
    write_rank_state,
    write_state,
)
from asyncrl.fs import atomic_directory
from asyncrl.run.layout import CHECKPOINT_COMPLETE

OLD_RANK_STATE = "rank_*.pt"
_METADATA_CLASSES = (
    "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
    "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING",
)  # fmt: skip


class _StorageInfo:
    """What DCP's file storage records per item (file, offset, length): rebuilt here from its
    pickled fields rather than importing DCP's private class."""

    relative_path: str
    offset: int
    length: int
    transform_descriptors: Any = None


def _allowed(module: str, name: str) -> Any:
    """The only globals a DCP `.metadata` may name; None for anything else."""
    if module == "torch.distributed.checkpoint.metadata" and name in _METADATA_CLASSES:
        return getattr(dcp_metadata, name)
    if module == "torch.distributed.checkpoint.filesystem" and name == "_StorageInfo":
        return _StorageInfo
    if module == "torch" and name == "Size":
        return torch.Size
    if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)
    if module == "torch.serialization" and name == "_get_layout":
        return _layout
    if module == "pathlib" and name in ("PosixPath", "PurePosixPath"):
        return {"PosixPath": PosixPath, "PurePosixPath": PurePosixPath}[name]
    return None


def _layout(name: str) -> torch.layout:
    layouts = {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}
    if name not in layouts:
        raise pickle.UnpicklingError(f"unknown torch layout {name!r}")
    return layouts[name]


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _allowed(module, name)
        if found is None:
            raise pickle.UnpicklingError(
                f"{module}.{name} is not part of a DCP checkpoint index; refusing to load it"
            )
        return found


def read_pickled_metadata(path: Path) -> dcp_metadata.Metadata:
    try:
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as error:
        raise CheckpointRefused(f"{path}: {error}") from None
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise CheckpointRefused(f"{path} holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


def _item(shards: Path, info: _StorageInfo, fqn: str) -> Any:
    if getattr(info, "transform_descriptors", None):
        raise CheckpointRefused(f"{shards}: {fqn} is stored with transforms; cannot convert it")
    file = shards / str(info.relative_path)
    if file.parent != shards:
        raise CheckpointRefused(f"{shards}: {fqn} names a file outside the checkpoint: {file}")
    with open(file, "rb") as data:
        data.seek(int(info.offset))
        raw = data.read(int(info.length))
    try:
        return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as error:  # torch's refusal of a hostile or broken item: name it
        raise CheckpointRefused(f"{file}: item {fqn} cannot be read safely: {error}") from None


def read_pickled_shards(shards: Path) -> dict[str, Any]:
    """The whole state dict of an old-format `shards/` directory, nested as it was saved."""
    metadata = read_pickled_metadata(shards / PICKLED_METADATA)
    where = {(index.fqn, tuple(index.offset or ())): info
             for index, info in metadata.storage_data.items()}  # fmt: skip
    flat: dict[str, Any] = {}
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, dcp_metadata.BytesStorageMetadata):
            flat[fqn] = _item(shards, where[(fqn, ())], fqn)
            continue
        whole = torch.empty(item.size, dtype=item.properties.dtype)
        for chunk in item.chunks:
            part = _item(shards, where[(fqn, tuple(chunk.offsets))], fqn)
            if not isinstance(part, torch.Tensor) or part.shape != chunk.sizes:
                raise CheckpointRefused(f"{shards}: a chunk of {fqn} is not a tensor of "
                                        f"{list(chunk.sizes)}")  # fmt: skip
            target = whole
            for dim, (start, length) in enumerate(zip(chunk.offsets, chunk.sizes, strict=True)):
                target = target.narrow(dim, start, length)
            target.copy_(part)
        flat[fqn] = whole
    return _unflatten(flat, metadata.planner_data or {})


def _unflatten(flat: dict[str, Any], paths: dict[str, Any]) -> dict[str, Any]:
    """DCP's flat keys back to the nested dicts (and lists, by integer keys) they came from."""
    nested: dict[str, Any] = {}
    for fqn, value in flat.items():
        path = list(paths.get(fqn, (fqn,)))
        node: Any = nested
        for key, following in itertools.pairwise(path):
            empty: Any = [] if isinstance(following, int) else {}
            if isinstance(node, list):
                while len(node) <= key:
                    node.append(None)
                node[key] = node[key] if node[key] is not None else empty
                node = node[key]
            else:
                node = node.setdefault(key, empty)
        last = path[-1]
        if isinstance(node, list):
            while len(node) <= last:
                node.append(None)
        node[last] = value
    return nested


def migrate_checkpoint(directory: Path) -> None:
    """Rewrite one pickled trainer checkpoint in place in the current format."""
    state = read_pickled_shards(directory / SHARDS)
    rank_states = sorted(directory.glob(OLD_RANK_STATE))
    if not rank_states:
        raise CheckpointRefused(f"{directory} has no rank_<r>.pt: not a trainer checkpoint")
    with atomic_directory(directory) as converted:
        write_state(converted, state, distributed=False, is_main=True)
        for path in rank_states:
            rank = int(path.stem.removeprefix("rank_"))
            try:
                record = torch.load(path, map_location="cpu", weights_only=True)
                torch.set_rng_state(record["torch_rng"])  # written as this process's RNG
                write_rank_state(converted, rank, int(record["step"]), record["scheduler"],
                                 int(record.get("world_size", 1)))  # fmt: skip
            except (KeyError, TypeError, ValueError, RuntimeError, pickle.UnpicklingError) as error:
                raise CheckpointRefused(f"{path} cannot be read safely: {error}") from None
        if (directory / CHECKPOINT_COMPLETE).exists():
            shutil.copy2(directory / CHECKPOINT_COMPLETE, converted / CHECKPOINT_COMPLETE)


def pickled_checkpoints(path: Path) -> list[Path]:
    """The old-format trainer checkpoints at or under `path`."""
    if (path / SHARDS / PICKLED_METADATA).exists():
        return [path]
    return sorted(found.parent.parent for found in path.glob(f"**/{SHARDS}/{PICKLED_METADATA}"))


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    converted = 0
    for argument in argv:
        found = pickled_checkpoints(Path(argument))
        if not found:
            print(f"asyncrl migrate-checkpoint: no pickled checkpoint at or under {argument}",
                  file=sys.stderr)  # fmt: skip
        for directory in found:
            rng = torch.get_rng_state()
            try:
                migrate_checkpoint(directory)
            except CheckpointRefused as error:
                print(f"asyncrl migrate-checkpoint: {error}", file=sys.stderr)
                return 2
            finally:
                torch.set_rng_state(rng)
            converted += 1
            print(f"converted {directory}")
    return 0 if converted else 1
