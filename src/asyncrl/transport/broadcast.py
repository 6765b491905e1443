"""Filesystem weight broadcast: `<run_dir>/broadcasts/step_N/` holding a Hugging Face
checkpoint (full weights) or a PEFT adapter (LoRA), with a `STABLE` marker.

The directory is filled under a temporary name and renamed whole; `MANIFEST.json` (a checksum
per tensor, `weights/manifest.py`) and, for a full version, perhaps `weights.delta` (what
changed since the version before, `weights/delta.py`) go in with the weights, and `STABLE`
(JSON: step, kind, fingerprint) is written inside it last, so a reader that sees `STABLE` sees
complete weights, and a server checks what it loaded against the manifest.
Old steps are pruned, keeping the newest `keep` (what `max_async_level` may still ask for),
but never while the orchestrator has servers loading one: it holds `broadcasts/LOCK` shared
meanwhile, pruning needs it exclusive and otherwise waits for the next publish (`flock`: local
filesystems, and NFS, where Linux maps it to byte-range locks).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from asyncrl.fs import atomic_directory, atomic_write_bytes
from asyncrl.log import get_logger
from asyncrl.run.layout import BROADCAST_STABLE, broadcast_dir, broadcasts_dir, broadcasts_lock
from asyncrl.step_dirs import remove_steps_after, step_dirs
from asyncrl.transport.weights.manifest import Manifest, make_manifest, write_manifest

if TYPE_CHECKING:  # only `publish_weights` takes tensors; the launcher reads markers, without torch
    import torch

logger = get_logger(__name__)

STABLE = BROADCAST_STABLE  # the marker, written last


@dataclass(frozen=True)
class Broadcast:
    step: int
    # nccl, pushed: the weights went another way (NCCL, a transport of the user's), only the
    # marker is here
    kind: Literal["full", "lora", "nccl", "pushed"]
    fingerprint: str
    path: Path
    # the servers already hold these weights (nccl, or a colocated trainer's in-memory sync):
    # readers only ask them for their version; the files, if any, are for eval and export
    pushed: bool = False


def publish_weights(
    run_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    keep: int,
    state_dict: dict[str, torch.Tensor] | None = None,
    pushed: bool = False,
    keep_every: int | None = None,
    manifest: Manifest | None = None,
    delta: bytes | None = None,
) -> Broadcast:
    """Write the model's weights (or its LoRA adapter) as broadcast `step`, with its manifest;
    prune old ones. `state_dict`: the full weights when the model itself holds only a shard
    (FSDP). `manifest`: made by the caller (with the served dtype's checksums, and `delta`'s
    base when a delta goes beside the weights); else made here from the tensors saved."""
    is_lora = hasattr(model, "peft_config")
    kind: Literal["full", "lora"] = "lora" if is_lora else "full"
    if state_dict is not None:  # the names one process saves: a tied head is not its own tensor
        own = {name for name, _ in model.named_parameters()}
        own |= {name for name, _ in model.named_buffers()}
        state_dict = {name: tensor for name, tensor in state_dict.items() if name in own}
    if manifest is None:
        manifest = make_manifest(step, saved_tensors(model, state_dict))[0]
    fingerprint = manifest.fingerprint
    target = broadcast_dir(run_dir, step)
    with atomic_directory(target) as staging:
        model.save_pretrained(staging, state_dict=state_dict)
        write_manifest(staging, manifest)
        if delta is not None and manifest.delta is not None:
            atomic_write_bytes(staging / manifest.delta.file, delta)
        marker = {"step": step, "kind": kind, "fingerprint": fingerprint, "time": time.time()}
        if pushed:
            marker["pushed"] = True
        atomic_write_bytes(staging / STABLE, json.dumps(marker).encode())
    prune(run_dir, keep, keep_every)
    return Broadcast(step, kind, fingerprint, target, pushed)


def saved_tensors(
    model: torch.nn.Module, state_dict: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """What `save_pretrained` writes, by the names it writes them under: the parameters (a tied
    head once), or a PEFT model's adapter (PEFT's names, without the adapter's)."""
    if hasattr(model, "peft_config"):
        from peft import get_peft_model_state_dict

        return dict(get_peft_model_state_dict(model))
    if state_dict is None:
        return {name: parameter.detach() for name, parameter in model.named_parameters()}
    names = [name for name, _ in model.named_parameters()]
    return {name: state_dict[name] for name in names}


MARKER_ONLY = ("nccl", "pushed")  # kinds whose weights are not in the directory


def publish_marker(
    run_dir: str | Path,
    step: int,
    fingerprint: str,
    keep: int,
    keep_every: int | None = None,
    kind: Literal["nccl", "pushed"] = "nccl",
) -> Broadcast:
    """After the servers received weights version `step` another way (NCCL, or a transport
    of the user's: `kind` "pushed"): the STABLE marker alone, so readers learn that it is out."""
    target = broadcast_dir(run_dir, step)
    with atomic_directory(target) as staging:
        marker = {"step": step, "kind": kind, "fingerprint": fingerprint, "time": time.time()}
        atomic_write_bytes(staging / STABLE, json.dumps(marker).encode())
    prune(run_dir, keep, keep_every)
    return Broadcast(step, kind, fingerprint, target, pushed=True)


def read_broadcast(path: Path) -> Broadcast | None:
    """The broadcast in `path`, or None if it is not (yet) complete."""
    marker = path / STABLE
    if not marker.exists():
        return None
    try:
        data = json.loads(marker.read_text())
        pushed = bool(data.get("pushed", data["kind"] in MARKER_ONLY))
        return Broadcast(int(data["step"]), data["kind"], str(data["fingerprint"]), path, pushed)
    except (json.JSONDecodeError, KeyError, ValueError) as error:
        raise ValueError(f"{marker}: not a valid STABLE marker ({error})") from error


def stable_steps(run_dir: str | Path) -> list[int]:
    """Steps with a complete broadcast, ascending."""
    return [step for step, path in step_dirs(broadcasts_dir(run_dir)) if (path / STABLE).exists()]


def latest_broadcast(run_dir: str | Path, at_least: int = 0) -> Broadcast | None:
    """The newest complete broadcast with step >= `at_least`, if any."""
    steps = [s for s in stable_steps(run_dir) if s >= at_least]
    return read_broadcast(broadcast_dir(run_dir, steps[-1])) if steps else None


def prune(run_dir: str | Path, keep: int, keep_every: int | None = None) -> None:
    """Remove all but the newest `keep` broadcasts and those of every `keep_every`-th step,
    unless servers are loading one now."""
    with _lock(run_dir, fcntl.LOCK_EX) as locked:
        if not locked:
            return
        steps = stable_steps(run_dir)
        for step in steps[: max(0, len(steps) - keep)]:
            if keep_every and step % keep_every == 0:
                continue
            shutil.rmtree(broadcast_dir(run_dir, step), ignore_errors=True)


@asynccontextmanager
async def broadcasts_in_use(run_dir: str | Path) -> AsyncIterator[None]:
    """Hold off pruning while servers are told to load a broadcast (the trainer prunes in a
    few milliseconds: wait for it rather than block the event loop)."""
    while True:
        with _lock(run_dir, fcntl.LOCK_SH) as locked:
            if locked:
                yield
                return
        await asyncio.sleep(0.01)


@contextmanager
def _lock(run_dir: str | Path, kind: int) -> Iterator[bool]:
    """`broadcasts/LOCK` taken shared or exclusive without waiting: True if it was."""
    path = broadcasts_lock(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, kind | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            locked = False
        yield locked  # closing the file releases the lock


def forget_broadcasts_after(run_dir: str | Path, step: int) -> None:
    """Before a resume from `step`: the broadcasts a crashed run made later belong to a future
    the resumed run will redo."""
    remove_steps_after(broadcasts_dir(run_dir), step)
