"""Read an offline W&B run's history back from its `run-<id>.wandb` file (W&B's SDK no longer
ships a reader): a LevelDB-format log of `wandb_internal_pb2.Record` protobufs."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK = 32768  # LevelDB log blocks; a record header never straddles one
RECORD_HEADER = 7  # crc32 (4), length (2), type (1)
FULL, LAST = 1, 4


def records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1, f"{path}: not a W&B run file"
    position, pending = 7, b""
    while position + RECORD_HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < RECORD_HEADER:  # the block's zero padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + RECORD_HEADER])
        pending += data[position + RECORD_HEADER : position + RECORD_HEADER + length]
        position += RECORD_HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def history(run_dir: Path) -> list[dict[str, Any]]:
    """Every `run.log` call of the one offline run under `run_dir`, in order."""
    [path] = run_dir.rglob("offline-run-*/run-*.wandb")
    return [
        {
            ("/".join(item.nested_key) or item.key): json.loads(item.value_json)
            for item in r.history.item
        }
        for r in records(path)
        if r.WhichOneof("record_type") == "history"
    ]
