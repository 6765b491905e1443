"""Where `torch.distributed.checkpoint` (DCP) puts tensors: raw bytes and a JSON index, no pickle.

DCP plans who writes and reads which slice of which tensor, and reshards on load (a checkpoint
written by N ranks resumes on M). Its own file storage, though, pickles its index (`.metadata`)
and stores each tensor as a `torch.save` pickle; and its default planner reads non-tensor items
with `torch.load(weights_only=False)`, which runs whatever code such an item names. This
storage keeps DCP's planning and replaces the files:

- `index.json`: per tensor its dtype, shape and chunks; per chunk the file, byte offset and
  length of its bytes. Written by the coordinating rank once every rank has written.
- `__<rank>_data.bin`: each rank's chunks, raw bytes in C order, one after another.

Only tensors go through it: the writer refuses a non-tensor item, and the reader's index has
no way to describe one, so a byte item can never be planned, let alone unpickled. Everything
read is checked against the index (a known dtype, sizes that add up, a file name without a
path) before a byte is interpreted; a mismatch is a `CheckpointRefused` naming the file.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from asyncrl.checkpoint.plain_values import CheckpointRefused
from asyncrl.fs import atomic_write_bytes

INDEX = "index.json"
FORMAT = "asyncrl-tensors"
VERSION = 1
DATA_FILE = re.compile(r"^__\d+_data\.bin$")
DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool,
    )
}  # fmt: skip


@dataclass(frozen=True)
class ChunkBytes:
    """Where one saved chunk's bytes are: `file` in the checkpoint directory, from `offset`."""

    file: str
    offset: int
    length: int


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"cannot checkpoint a tensor of dtype {dtype}")
    return name


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes in C order, without a copy when it is already contiguous on CPU."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


class TensorWriter(StorageWriter):
    """DCP storage writer for `directory`: raw chunk bytes per rank, a JSON index."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = Path(directory)

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.directory = Path(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [
            SavePlan(plan.items, storage_data=f"__{rank}_data.bin", planner_data=plan.planner_data)
            for rank, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        file = str(plan.storage_data)
        results = []
        with open(self.directory / file, "wb") as out:
            for item in plan.items:
                if item.type == WriteItemType.BYTE_IO:
                    raise ValueError(
                        f"checkpoint item {item.index.fqn} is not a tensor: only tensors are "
                        "written as shards (plain values go to JSON)"
                    )
                data = _raw_bytes(planner.resolve_data(item))
                results.append(
                    WriteResult(item.index, data.nbytes, ChunkBytes(file, out.tell(), data.nbytes))
                )
                out.write(data)
            out.flush()
            os.fsync(out.fileno())
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        where = {r.index: r.storage_data for rank in results for r in rank}
        tensors = {}
        for fqn, item in metadata.state_dict_metadata.items():
            if not isinstance(item, TensorStorageMetadata):
                raise ValueError(f"checkpoint item {fqn} is not a tensor")
            chunks = []
            for chunk in item.chunks:
                stored: ChunkBytes = where[MetadataIndex(fqn, chunk.offsets)]
                chunks.append({
                    "offsets": list(chunk.offsets), "sizes": list(chunk.sizes),
                    "file": stored.file, "offset": stored.offset, "length": stored.length,
                })  # fmt: skip
            tensors[fqn] = {
                "dtype": _dtype_name(item.properties.dtype),
                "shape": list(item.size),
                "chunks": chunks,
            }
        index = {"format": FORMAT, "version": VERSION, "tensors": tensors}
        atomic_write_bytes(self.directory / INDEX, json.dumps(index).encode())

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self.directory))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True


class TensorReader(StorageReader):
    """DCP storage reader for what `TensorWriter` wrote; refuses anything else."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = Path(directory)
        self.chunks: dict[MetadataIndex, tuple[ChunkBytes, torch.dtype, torch.Size]] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.directory = Path(checkpoint_id)
        self.chunks = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        index_path = self.directory / INDEX
        try:
            index = json.loads(index_path.read_bytes())
        except (OSError, ValueError) as error:
            raise CheckpointRefused(f"{index_path} cannot be read: {error}") from None
        if not isinstance(index, dict) or index.get("format") != FORMAT:
            raise CheckpointRefused(f"{index_path} is not an asyncrl tensor index")
        if index.get("version") != VERSION:
            raise CheckpointRefused(
                f"{index_path} has version {index.get('version')!r}; this asyncrl reads {VERSION}"
            )
        described: dict[str, Any] = {}
        self.chunks = {}
        tensors = index.get("tensors")
        if not isinstance(tensors, dict):
            raise CheckpointRefused(f"{index_path}: `tensors` is not an object")
        for fqn, entry in tensors.items():
            try:
                described[fqn] = self._tensor(fqn, entry)
            except (KeyError, TypeError, ValueError) as error:
                raise CheckpointRefused(f"{index_path}: tensor {fqn!r}: {error}") from None
        return Metadata(state_dict_metadata=described, storage_data=dict(self.chunks))

    def _tensor(self, fqn: str, entry: dict[str, Any]) -> TensorStorageMetadata:
        if entry["dtype"] not in DTYPES:
            raise ValueError(f"dtype {entry['dtype']!r} is not one asyncrl writes")
        dtype = DTYPES[entry["dtype"]]
        shape = torch.Size(_naturals(entry["shape"]))
        chunks = []
        for chunk in entry["chunks"]:
            offsets = torch.Size(_naturals(chunk["offsets"]))
            sizes = torch.Size(_naturals(chunk["sizes"]))
            if (
                len(offsets) != len(shape)
                or len(sizes) != len(shape)
                or any(o + s > n for o, s, n in zip(offsets, sizes, shape, strict=True))
            ):
                raise ValueError(f"chunk at {list(offsets)} of {list(sizes)} is outside {shape}")
            file = chunk["file"]
            if not isinstance(file, str) or not DATA_FILE.match(file):
                raise ValueError(f"chunk file {file!r} is not a data file of this directory")
            length = math.prod(sizes) * torch.tensor([], dtype=dtype).element_size()
            if chunk["length"] != length:
                raise ValueError(f"a chunk of {list(sizes)} {dtype} has {length} bytes, not "
                                 f"{chunk['length']}")  # fmt: skip
            (offset,) = _naturals([chunk["offset"]])
            self.chunks[MetadataIndex(fqn, offsets)] = (ChunkBytes(file, offset, length), dtype,
                                                        sizes)  # fmt: skip
            chunks.append(ChunkStorageMetadata(offsets=offsets, sizes=sizes))
        return TensorStorageMetadata(TensorProperties(dtype=dtype), shape, chunks)

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        by_file: dict[str, list[Any]] = {}
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:  # the index cannot describe one; never load it
                raise CheckpointRefused(f"{self.directory}: item {item.dest_index.fqn} is not a "
                                        "tensor")  # fmt: skip
            stored, _, _ = self.chunks[item.storage_index]
            by_file.setdefault(stored.file, []).append(item)
        for file, items in by_file.items():
            with open(self.directory / file, "rb") as data:
                for item in items:
                    stored, dtype, sizes = self.chunks[item.storage_index]
                    data.seek(stored.offset)
                    raw = torch.empty(stored.length, dtype=torch.uint8)
                    if stored.length and data.readinto(memoryview(raw.numpy())) != stored.length:
                        raise CheckpointRefused(
                            f"{self.directory / file} ends before the bytes of "
                            f"{item.storage_index.fqn} (truncated?)"
                        )
                    chunk = (
                        raw.view(dtype).reshape(sizes)
                        if stored.length
                        else torch.empty(sizes, dtype=dtype)
                    )
                    for dim, (start, length) in enumerate(
                        zip(item.storage_offsets, item.lengths, strict=True)
                    ):
                        chunk = chunk.narrow(dim, start, length)
                    target = planner.resolve_tensor(item).detach()
                    if target.size() != chunk.size():
                        raise CheckpointRefused(
                            f"{self.directory}: {item.dest_index.fqn} is {list(chunk.size())} in "
                            f"the checkpoint, {list(target.size())} in the model"
                        )
                    target.copy_(chunk)
                    planner.commit_tensor(item, target)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True


def _naturals(values: Any) -> list[int]:
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        raise ValueError(f"{values!r} is not a list of natural numbers")
    return values
