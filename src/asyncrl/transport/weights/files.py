"""Weights as files: version s is `broadcasts/step_s/` under the run (a Hugging Face checkpoint,
or a PEFT adapter for LoRA), which the orchestrator tells the servers to load (`broadcast.py`
has the layout and its guarantees). The servers need no receiver: the orchestrator's HTTP call
is the intake.

Beside full weights go their manifest (a checksum per tensor, at the trainer's precision and at
the servers', `manifest.py`) and, when `weight_broadcast.delta` says it pays, `weights.delta`:
the version as what changed since the one this trainer wrote before (`delta.py`). A server
holding that base reads only the delta; any other (started later, restarted, behind, serving
another dtype, vLLM or SGLang) reads the full weights, which are always there: evaluation and
export read them too, and no server ever depends on a chain of deltas.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from pathlib import Path

import torch

from asyncrl.config.trainer import TrainerConfig
from asyncrl.log import get_logger
from asyncrl.run.layout import broadcast_dir
from asyncrl.transport.broadcast import STABLE, publish_weights, saved_tensors
from asyncrl.transport.fingerprint import version_checksum
from asyncrl.transport.weights.delta import (
    DELTA_FILE,
    DeltaPolicy,
    Written,
    default_codec,
    delta_bytes,
    encode_delta,
    full_bytes,
    pack_delta,
)
from asyncrl.transport.weights.manifest import DeltaBase, dtype_name, make_manifest
from asyncrl.transport.weights.route import State, WeightRoute, WeightTransport
from asyncrl.transport.weights.served_dtype import served_dtype

logger = get_logger(__name__)


class FilesRoute(WeightRoute):
    """Weights out after each step, without holding up the next one.

    A directory of full weights is written by a thread of its own from a copy taken when the
    step ends (the next step changes the weights in place), so the trainer trains on while the
    files and their fingerprint are written: in the quick start's disaggregated layout that
    write was a tenth of every step. Writes stay in step order (each waits for the one before),
    and a write that failed raises at the next publish or at `close`. A LoRA adapter is small
    and written at once."""

    def __init__(self, config: TrainerConfig, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.keep = config.max_async_level + 2  # what `max_async_level` may still ask for
        self.keep_every = config.weights_interval  # every N-th step's weights stay
        self.writer: threading.Thread | None = None
        self.failure: BaseException | None = None
        self.config = config
        self.codec = default_codec()
        self.previous: Written | None = None  # none after a start: the first version goes full
        self.sizes: dict[str, float] = {}  # of the version last written, reported at the next

    @functools.cached_property
    def served_dtype(self) -> torch.dtype:
        return served_dtype(self.config)

    def publish(self, step: int, model: torch.nn.Module, state: State) -> dict[str, float]:
        self.wait()
        sizes, self.sizes = self.sizes, {}
        if hasattr(model, "peft_config"):
            self.write(step, model, state)
            return sizes
        snapshot = state if state is not None else weights_snapshot(model)
        self.writer = threading.Thread(
            target=self._write_in_background, args=(step, model, snapshot),
            name=f"asyncrl-publish-{step}",
        )  # fmt: skip
        self.writer.start()
        return sizes

    def republish(self, version: int, model: torch.nn.Module, state: State) -> bool:
        """Only when the resumed step's broadcast is gone (pruned, or never made)."""
        if (broadcast_dir(self.run_dir, version) / STABLE).exists():
            return False
        self.wait()
        snapshot = state if state is not None or hasattr(model, "peft_config") else None
        self.write(version, model, snapshot or weights_snapshot(model))
        return True

    def write(self, step: int, model: torch.nn.Module, state: State) -> None:
        """Version `step`: the weights, their manifest, and the delta from the version written
        before when it pays. `state`: a copy of the weights, or a LoRA model's None."""
        if hasattr(model, "peft_config"):
            publish_weights(
                self.run_dir, step, model, keep=self.keep, state_dict=state,
                keep_every=self.keep_every,
            )  # fmt: skip
            return
        assert state is not None, "full weights are written from a copy (`weights_snapshot`)"
        tensors = saved_tensors(model, state)
        manifest, served = make_manifest(step, tensors, self.served_dtype)
        trainer_dtype = next(t.dtype for t in tensors.values() if t.is_floating_point())
        policy = DeltaPolicy(self.config.weight_broadcast.delta, trainer_dtype, self.served_dtype)
        delta = None
        full = full_bytes(served)
        self.sizes = {"trainer/weights_full_bytes": float(full)}
        if policy.wanted and self.previous is not None:
            blobs = encode_delta(self.previous.served, served, self.codec)
            size = delta_bytes(blobs)
            self.sizes["trainer/weights_delta_bytes"] = float(size)
            if policy.pays(size, full):
                base = DeltaBase(
                    self.previous.step, self.previous.checksum, dtype_name(self.served_dtype),
                    self.codec, DELTA_FILE,
                )  # fmt: skip
                manifest, delta = dataclasses.replace(manifest, delta=base), pack_delta(blobs)
        publish_weights(
            self.run_dir, step, model, keep=self.keep, state_dict=state,
            keep_every=self.keep_every, manifest=manifest, delta=delta,
        )  # fmt: skip
        if policy.wanted:
            checksums = manifest.checksums_at(self.served_dtype)
            assert checksums is not None  # made at the served dtype just above
            self.previous = Written(step, dict(served), version_checksum(checksums))

    def _write_in_background(self, step: int, model: torch.nn.Module, state: State) -> None:
        try:
            self.write(step, model, state)
        except BaseException as error:  # raised in the training thread, at the next call
            self.failure = error

    def wait(self) -> None:
        """Until the last write is on disk; its failure, if any, is raised here."""
        if self.writer is not None:
            self.writer.join()
            self.writer = None
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise RuntimeError(f"writing a weights broadcast failed: {failure}") from failure

    def close(self) -> None:
        self.wait()


def weights_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of what a process saves of the model: its parameters (a tied head once) and
    persistent buffers, detached from the tensors the next step updates."""
    own = {name for name, _ in model.named_parameters()}
    own |= {name for name, _ in model.named_buffers()}
    with torch.no_grad():
        return {
            name: tensor.detach().clone()
            for name, tensor in model.state_dict().items()
            if name in own
        }


TRANSPORT = WeightTransport("filesystem", route=FilesRoute)
