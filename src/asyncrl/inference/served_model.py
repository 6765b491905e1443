"""What the server serves: the model, its name, the weights' version and fingerprint, LoRA.

Every change to weights runs on the engine thread between decode steps (`Engine.run_exclusive`),
so no forward pass ever sees half-updated weights. Sequences in flight continue with the new
weights; their earlier tokens keep the version that produced them. Changes are one at a time
(`_load_lock`): two versions racing to the server are installed one after the other, each whole,
and a delta is applied only to the weights it names as its base.

A version the trainer made comes with its manifest (`transport/weights/manifest.py`): it is
checked before it is installed (`verified_load.py`), at the dtype served, and a version that
does not check is read once more, then refused naming the tensors (the server keeps serving the
version it holds); weights that do not hold what was checked after the swap make the engine
give up (the process exits for its supervisor to restart it). `/weight_info` says which
trainer fingerprint the weights were checked against (`verified`), their checksum as served
(`checksum`, what a delta's base is compared with) and how often a reload was needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from asyncrl.inference.int8_linears import is_int8
from asyncrl.inference.serving_engine import ServingEngine
from asyncrl.inference.verified_load import (
    Staged,
    copies_that_differ,
    installed_mismatches,
    manifest_of,
    stage_delta,
    stage_delta_blobs,
    stage_full,
)
from asyncrl.inference.weights import (
    LoraAdapter,
    UnreadableWeights,
    WeightLoadError,
    apply_lora,
    read_lora_adapter,
    weight_directory,
)
from asyncrl.log import get_logger
from asyncrl.step_dirs import step_of
from asyncrl.transport.fingerprint import tensor_checksums, version_checksum, weights_fingerprint
from asyncrl.transport.weights.delta import DeltaError, DeltaRefused
from asyncrl.transport.weights.manifest import (
    DeltaBase,
    Manifest,
    WeightsMismatch,
    check_checksums,
    dtype_name,
)

logger = get_logger(__name__)


@dataclass(frozen=True)
class WeightInfo:
    version: int
    fingerprint: str
    weight_dir: str | None
    lora_name: str | None
    # the trainer's fingerprint the weights were checked against (None: not checked, e.g. the
    # model the server started with, or a directory without a manifest)
    verified: str | None = None
    checksum: str | None = None  # of the base weights as served (None: not computed yet)
    dtype: str = ""
    weight_reloads: int = 0  # loads read again because what arrived did not check
    loaded: str | None = None  # how the last version came: full, delta, lora, or its source
    bytes_read: int = 0  # by the last load from files
    quantization: str = "none"  # "int8": the linears multiply int8 copies (`int8_linears.py`)


class ServedModel:
    def __init__(
        self,
        engine: ServingEngine,
        name: str,
        weight_roots: list[str],
        enable_lora: bool,
        max_lora_rank: int | None,
    ) -> None:
        self.engine = engine
        self.name = name
        self.weight_roots = weight_roots
        self.enable_lora = enable_lora
        self.max_lora_rank = max_lora_rank
        self._lock = threading.Lock()  # guards what `info` reads
        self._load_lock = threading.Lock()  # one weight change at a time
        self._version = 0
        self._weight_dir: str | None = None
        self._adapter: LoraAdapter | None = None
        self._base_weights: dict[str, torch.Tensor] = {}
        # of the base weights as served, per tensor (None: not computed since they changed)
        self._checksums: dict[str, str] | None = tensor_checksums(engine.named_weights())
        self._fingerprint = version_checksum(self._checksums)
        self._base_fingerprint = self._fingerprint  # of the weights without a merged adapter
        self._verified: str | None = None
        self._loaded: tuple[str | None, int] = (None, 0)
        self.weight_reloads = 0
        # what it serves in, reported with every weight info: the same for the server's life
        self.quantization = "int8" if any(map(is_int8, engine.model.modules())) else "none"
        # event loops awaiting a change of version (a long-polled /weight_info)
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    # reading -------------------------------------------------------------------------------------
    def info(self) -> WeightInfo:
        checksums = self._checksums
        with self._lock:
            return WeightInfo(
                self._version,
                self._fingerprint,
                self._weight_dir,
                self._adapter.name if self._adapter else None,
                verified=self._verified,
                checksum=version_checksum(checksums) if checksums is not None else None,
                dtype=dtype_name(self.served_dtype),
                weight_reloads=self.weight_reloads,
                loaded=self._loaded[0],
                bytes_read=self._loaded[1],
                quantization=self.quantization,
            )

    @property
    def served_dtype(self) -> torch.dtype:
        return next(tensor for _, tensor in self.engine.named_weights()).dtype

    async def version_change(self, known: int, timeout: float) -> None:
        """Return once the version is not `known` any more, or after `timeout` seconds: the
        orchestrator learns of weights a colocated trainer installs the moment they are in,
        instead of asking every 50 ms."""
        loop = asyncio.get_running_loop()
        changed: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._version != known:
                return
            self._waiters.append((loop, changed))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed, timeout)

    def _wake_waiters(self) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, changed in waiters:
            loop.call_soon_threadsafe(lambda done=changed: done.done() or done.set_result(None))

    @property
    def model(self) -> torch.nn.Module:
        """The engine's model: what weights pushed by the trainer must fit (`WeightTarget`)."""
        return self.engine.model

    @property
    def adapter_name(self) -> str | None:
        return self._adapter.name if self._adapter else None

    def model_names(self) -> list[str]:
        adapter = self.adapter_name
        return [self.name] + ([adapter] if adapter else [])

    def held_checksums(self) -> dict[str, str]:
        """The base weights' checksums as served (computed once after a change that did not
        give them); what a delta's base is compared with. Call under the load lock."""
        if self._checksums is None:
            self._checksums = tensor_checksums(self.engine.named_weights())
        return self._checksums

    # changing weights ----------------------------------------------------------------------------
    def update_weights(self, weight_dir: str, version: int | None) -> WeightInfo:
        """Read, check and stage a version on the caller's thread while the engine goes on
        generating; it stops only for the swap (its own tensors replaced by the staged ones, no
        copy). From the delta beside the weights when the server holds its base, else from the
        full weights; a delta that does not check falls back to them."""
        directory = weight_directory(weight_dir, self.weight_roots)
        resolved_version = version if version is not None else _step_of(directory)
        with self._load_lock:
            manifest = manifest_of(directory)
            staged = self._stage_from_delta(directory, manifest)
            if staged is None:
                staged = self._stage_in_full(directory, manifest)
            self._install(staged, resolved_version, str(directory))
        logger.info("loaded weights from %s (version %s, %s, %d bytes read%s)", directory,
                    resolved_version, staged.kind, staged.bytes_read,
                    ", checked" if staged.verified else "")  # fmt: skip
        return self.info()

    def _stage_from_delta(self, directory: Path, manifest: Manifest | None) -> Staged | None:
        if manifest is None or manifest.delta is None:
            return None
        if (not_base := self._not_the_base(manifest.delta)) is not None:
            logger.info("%s: a delta, but %s: loading the full version", directory, not_base)
            return None
        try:
            return stage_delta(self.engine.model, directory, manifest, self.held_checksums())
        except (DeltaError, WeightsMismatch) as error:
            self.reloaded(f"{error}: loading the full version instead")
            return None

    def _not_the_base(self, base: DeltaBase) -> str | None:
        """Why the weights served are not `base` (a delta's), or None when they are: the same
        version, dtype and checksum as served, and no adapter merged. Under the load lock."""
        if self._adapter is not None:
            return f"adapter `{self._adapter.name}` is merged into the weights"
        served = dtype_name(self.served_dtype)
        if (self._version, served) != (base.step, base.dtype):
            return (f"this server holds version {self._version} in {served}, the delta applies "
                    f"to version {base.step} in {base.dtype}")  # fmt: skip
        if version_checksum(self.held_checksums()) != base.checksum:
            return f"this server's version {self._version} holds other weights than the base's"
        return None

    def apply_delta(
        self, step: int, blobs: dict[str, bytes], manifest: Manifest, source: str = "nccl"
    ) -> WeightInfo:
        """Install version `step` from a delta received (`blobs`, `manifest` naming its base):
        `DeltaRefused` when the server does not hold that base (the sender then sends the full
        version), `DeltaError` or `WeightsMismatch` when the result is not the trainer's."""
        assert manifest.delta is not None, "a delta version"
        with self._load_lock:
            if (not_base := self._not_the_base(manifest.delta)) is not None:
                raise DeltaRefused(f"weights version {step} ({source}): {not_base}")
            size = sum(len(blob) for blob in blobs.values())
            staged = stage_delta_blobs(
                self.engine.model, f"weights version {step} ({source})", manifest,
                self.held_checksums(), blobs, size,
            )  # fmt: skip
            self._install(staged, step, source)
        logger.info("installed weights version %d (%s, a delta of %d bytes)", step, source, size)
        return self.info()

    def _stage_in_full(self, directory: Path, manifest: Manifest | None) -> Staged:
        """The full version, read once more when it does not check (the trainer's version, with
        a manifest); `WeightsMismatch` or `UnreadableWeights` if it still does not."""
        try:
            return stage_full(self.engine.model, directory, self.weight_roots, manifest)
        except (WeightsMismatch, UnreadableWeights) as error:
            if manifest is None:
                raise
            self.reloaded(f"{error}: reading it once more")
        return stage_full(self.engine.model, directory, self.weight_roots, manifest)

    def reloaded(self, why: str) -> None:
        """A version is read (or asked for) again: what arrived did not check."""
        self.weight_reloads += 1
        logger.warning("inference: weights reloaded (%d so far): %s", self.weight_reloads, why)

    def give_up(self, reason: str) -> None:
        """Stop serving: the weights can no longer be trusted (`ServingEngine.give_up`)."""
        self.engine.give_up(reason)

    def _install(self, staged: Staged, version: int, weight_dir: str) -> None:
        """Swap the staged tensors in on the engine's thread, then make sure the engine holds
        them (a tensor it copied rather than took is hashed); copied once more if not, and if
        it still does not, the engine gives up rather than serve weights nobody checked."""

        def load() -> None:
            self.engine.install(staged.tensors, take=True)
            wrong = installed_mismatches(self.engine.model, staged)
            if wrong:
                self.reloaded(f"{wrong[:3]} are not what was checked after installing them")
                self.engine.install(staged.tensors)
                wrong = installed_mismatches(self.engine.model, staged)
            if wrong:
                reason = (f"weights version {version}: {wrong[:3]} do not hold what was checked "
                          "after installing them twice")  # fmt: skip
                self.engine.give_up(reason)
                raise WeightsMismatch(reason, wrong)
            # a full update replaces the base: a merged adapter would now be stale
            self._base_weights = {}
            self._adapter = None
            self._checksums = staged.checksums
            verified = staged.fingerprint if staged.verified else None
            self._set(version, weight_dir, staged.fingerprint, verified=verified,
                      loaded=(staged.kind, staged.bytes_read))  # fmt: skip

        self.engine.run_exclusive(load)

    def apply_received(
        self,
        step: int,
        tensors: dict[str, torch.Tensor],
        source: str = "nccl",
        manifest: Manifest | None = None,
    ) -> WeightInfo:
        """Install weights between engine steps: staged copies received over NCCL/gloo, or a
        colocated trainer's tensors handed over in memory (`source` "memory"). A tensor that
        already is the parameter's storage is not copied. With the sender's `manifest` the
        tensors are checked against it first (`WeightsMismatch` naming them, nothing
        installed); each copied into a parameter is compared with it after. When the tensors
        are every weight, the fingerprint is theirs, computed here before the engine stops; a
        part (LoRA's merged weights) is fingerprinted with the rest, on the engine's thread."""
        with self._load_lock:
            names = {name for name, _ in self.engine.named_weights()}
            whole = names == set(tensors)
            checksums = tensor_checksums(tensors.items()) if whole or manifest else None
            fingerprint = version_checksum(checksums) if whole and checksums else None
            if manifest is not None:  # as sent: the trainer's dtype, or the one served
                assert checksums is not None
                sent = next(t.dtype for t in tensors.values() if t.is_floating_point())
                expected = manifest.checksums_at(sent) or manifest.stored
                check_checksums(expected, checksums, f"weights version {step} ({source})")
                fingerprint = manifest.fingerprint
            same_dtype = all(t.dtype == self.served_dtype for t in tensors.values())

            def install() -> None:
                self.engine.install(tensors)
                wrong = (
                    copies_that_differ(self.engine.model, tensors)
                    if self.engine.parameters_as_installed
                    else []  # vLLM's loader checks what it is given, not what it repacks
                )
                if wrong:
                    reason = f"weights version {step} ({source}): {wrong[:3]} differ once copied"
                    self.engine.give_up(reason)
                    raise WeightsMismatch(reason, wrong)
                self._base_weights = {}
                self._adapter = None
                self._checksums = checksums if whole and same_dtype else None
                verified = manifest.fingerprint if manifest is not None else None
                self._set(step, source, fingerprint, verified=verified, loaded=(source, 0))

            self.engine.run_exclusive(install)
        logger.info("installed weights version %d (%s)", step, source)
        return self.info()

    def load_lora(
        self, name: str, path: str, load_inplace: bool, version: int | None
    ) -> WeightInfo:
        if not self.enable_lora:
            raise WeightLoadError("LoRA is disabled on this server (inference.enable_lora: false)")
        with self._load_lock:
            return self._load_lora(name, path, load_inplace, version)

    def _load_lora(
        self, name: str, path: str, load_inplace: bool, version: int | None
    ) -> WeightInfo:
        if self._adapter is not None and self._adapter.name != name:
            raise WeightLoadError(
                f"adapter `{self._adapter.name}` is loaded; unload it first (one adapter at a time)"
            )
        if self._adapter is not None and not load_inplace:
            raise WeightLoadError(f"adapter `{name}` is already loaded; pass load_inplace: true")
        directory = weight_directory(path, self.weight_roots)
        manifest = manifest_of(directory)
        expected = manifest.stored if manifest is not None else None
        try:
            adapter = read_lora_adapter(
                name, directory, self.engine.model, self.weight_roots, expected
            )
        except (WeightsMismatch, UnreadableWeights) as error:
            if manifest is None:
                raise
            self.reloaded(f"{error}: reading it once more")
            adapter = read_lora_adapter(
                name, directory, self.engine.model, self.weight_roots, expected
            )
        if self.max_lora_rank is not None and adapter.rank > self.max_lora_rank:
            raise WeightLoadError(
                f"adapter rank {adapter.rank} exceeds inference.max_lora_rank {self.max_lora_rank}"
            )
        resolved_version = version if version is not None else _step_of(directory)
        verified = manifest.fingerprint if manifest is not None else None

        def load() -> None:
            parameters = dict(self.engine.model.named_parameters())
            for target in adapter.factors:
                if target not in self._base_weights:
                    self._base_weights[target] = parameters[target].detach().clone()
            apply_lora(self.engine.model, self._base_weights, adapter)
            self._adapter = adapter
            served = merged_fingerprint(self._base_fingerprint, adapter)
            self._set(resolved_version, str(directory), served, adapted=True, verified=verified,
                      loaded=("lora", 0))  # fmt: skip

        self.engine.run_exclusive(load)
        logger.info("loaded LoRA adapter `%s` from %s", name, directory)
        return self.info()

    def unload_lora(self, name: str) -> WeightInfo:
        with self._load_lock:
            if self._adapter is None or self._adapter.name != name:
                raise WeightLoadError(f"adapter `{name}` is not loaded")

            def unload() -> None:
                apply_lora(self.engine.model, self._base_weights, None)
                self._adapter = None
                self._set(self._version, self._weight_dir, self._base_fingerprint,
                          verified=self._verified)  # fmt: skip

            self.engine.run_exclusive(unload)
        return self.info()

    def _set(
        self,
        version: int,
        weight_dir: str | None,
        fingerprint: str | None = None,
        adapted: bool = False,
        verified: str | None = None,
        loaded: tuple[str | None, int] | None = None,
    ) -> None:
        """Called on the engine thread, between steps: tokens sampled from now on carry it.
        `fingerprint`: of the weights as given; None: of the engine's weights as they are.
        `adapted`: an adapter is merged into them (else they are the base of the next one).
        `verified`: the trainer's fingerprint they were checked against."""
        self.engine.weight_version = version
        self.engine.forget_prefixes()  # keys and values of the old weights
        fingerprint = fingerprint or self._compute_fingerprint()
        if not adapted:
            self._base_fingerprint = fingerprint
        with self._lock:
            self._version = version
            self._weight_dir = weight_dir
            self._fingerprint = fingerprint
            self._verified = verified
            if loaded is not None:
                self._loaded = loaded
        self._wake_waiters()

    def _compute_fingerprint(self) -> str:
        return weights_fingerprint(self.engine.named_weights())


def merged_fingerprint(base: str, adapter: LoraAdapter) -> str:
    """What a server reports with `adapter` merged into weights of fingerprint `base`: the two
    combined (the adapter's factors and scale), the same for the same base and adapter. The
    merged weights are not read again: hashing them cost the engine's core 40-50 ms a load on
    SmolLM2, and over three times that with input-major weights (`input_major.py`)."""
    factors = [
        (f"{target}.{part}", tensor)
        for target, (lora_b, lora_a) in adapter.factors.items()
        for part, tensor in (("lora_B", lora_b), ("lora_A", lora_a))
    ]
    combined = f"{base}+{weights_fingerprint(factors)}*{adapter.scale!r}"
    return xxhash.xxh3_128(combined.encode()).hexdigest()[:16]


def _step_of(directory: Path) -> int:
    """`.../step_12` -> 12; anything else -> 0 (callers should pass `version`)."""
    return step_of(directory) or 0
