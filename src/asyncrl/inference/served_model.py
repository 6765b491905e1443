"""What the server serves: the model, its name, the weights' version and fingerprint, LoRA.

Every change to weights runs on the engine thread between decode steps (`Engine.run_exclusive`),
so no forward pass ever sees half-updated weights. Sequences in flight continue with the new
weights; their earlier tokens keep the version that produced them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from asyncrl.inference.input_major import like_parameter
from asyncrl.inference.int8_linears import is_int8
from asyncrl.inference.serving_engine import ServingEngine
from asyncrl.inference.weights import (
    LoraAdapter,
    WeightLoadError,
    apply_lora,
    read_full_weights,
    read_lora_adapter,
    weight_directory,
)
from asyncrl.log import get_logger
from asyncrl.step_dirs import step_of
from asyncrl.transport.fingerprint import weights_fingerprint

logger = get_logger(__name__)


@dataclass(frozen=True)
class WeightInfo:
    version: int
    fingerprint: str
    weight_dir: str | None
    lora_name: str | None
    dtype: str  # the float weights' and activations' ("float32", "bfloat16", ...)
    quantization: str  # "int8": the linears multiply int8 copies (`int8_linears.py`); "none"


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
        self._lock = threading.Lock()
        self._version = 0
        self._weight_dir: str | None = None
        self._adapter: LoraAdapter | None = None
        self._base_weights: dict[str, torch.Tensor] = {}
        self._fingerprint = self._compute_fingerprint()
        self._base_fingerprint = self._fingerprint  # of the weights without a merged adapter
        # what it serves in, reported with every weight info: the same for the server's life
        self.dtype = str(next(engine.model.parameters()).dtype).removeprefix("torch.")
        self.quantization = "int8" if any(map(is_int8, engine.model.modules())) else "none"
        # event loops awaiting a change of version (a long-polled /weight_info)
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    # reading -------------------------------------------------------------------------------------
    def info(self) -> WeightInfo:
        with self._lock:
            return WeightInfo(
                self._version,
                self._fingerprint,
                self._weight_dir,
                self._adapter.name if self._adapter else None,
                self.dtype,
                self.quantization,
            )

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

    # changing weights ----------------------------------------------------------------------------
    def update_weights(self, weight_dir: str, version: int | None) -> WeightInfo:
        """Read, check, fingerprint and cast the weights on the caller's thread while the
        engine goes on generating; it stops only for the swap (its own tensors replaced by the
        staged ones, no copy). The fingerprint is the checkpoint's, as the trainer wrote it,
        whatever dtype the engine serves in."""
        directory = weight_directory(weight_dir, self.weight_roots)
        resolved_version = version if version is not None else _step_of(directory)
        source = read_full_weights(self.engine.model, directory, self.weight_roots)
        fingerprint = weights_fingerprint(source.items())
        parameters = dict(self.engine.model.named_parameters())
        staged = {name: like_parameter(tensor, parameters[name]) for name, tensor in source.items()}

        def load() -> None:
            self.engine.install(staged, take=True)
            # a full update replaces the base: a merged adapter would now be stale
            self._base_weights = {}
            self._adapter = None
            self._set(resolved_version, str(directory), fingerprint)

        self.engine.run_exclusive(load)
        logger.info("loaded weights from %s (version %s)", directory, resolved_version)
        return self.info()

    def apply_received(
        self, step: int, tensors: dict[str, torch.Tensor], source: str = "nccl"
    ) -> WeightInfo:
        """Install weights between engine steps: staged copies received over NCCL/gloo, or a
        colocated trainer's tensors handed over in memory (`source` "memory"). A tensor that
        already is the parameter's storage is not copied. When the tensors are every weight,
        the fingerprint is theirs, computed here before the engine stops; a part (LoRA's merged
        weights) is fingerprinted with the rest, on the engine's thread."""
        names = {name for name, _ in self.engine.named_weights()}
        whole = names == set(tensors)
        fingerprint = weights_fingerprint(tensors.items()) if whole else None

        def install() -> None:
            self.engine.install(tensors)
            self._base_weights = {}
            self._adapter = None
            self._set(step, source, fingerprint)

        self.engine.run_exclusive(install)
        logger.info("installed weights version %d (%s)", step, source)
        return self.info()

    def load_lora(
        self, name: str, path: str, load_inplace: bool, version: int | None
    ) -> WeightInfo:
        if not self.enable_lora:
            raise WeightLoadError("LoRA is disabled on this server (inference.enable_lora: false)")
        if self._adapter is not None and self._adapter.name != name:
            raise WeightLoadError(
                f"adapter `{self._adapter.name}` is loaded; unload it first (one adapter at a time)"
            )
        if self._adapter is not None and not load_inplace:
            raise WeightLoadError(f"adapter `{name}` is already loaded; pass load_inplace: true")
        directory = weight_directory(path, self.weight_roots)
        adapter = read_lora_adapter(name, directory, self.engine.model, self.weight_roots)
        if self.max_lora_rank is not None and adapter.rank > self.max_lora_rank:
            raise WeightLoadError(
                f"adapter rank {adapter.rank} exceeds inference.max_lora_rank {self.max_lora_rank}"
            )
        resolved_version = version if version is not None else _step_of(directory)

        def load() -> None:
            parameters = dict(self.engine.model.named_parameters())
            for target in adapter.factors:
                if target not in self._base_weights:
                    self._base_weights[target] = parameters[target].detach().clone()
            apply_lora(self.engine.model, self._base_weights, adapter)
            self._adapter = adapter
            served = merged_fingerprint(self._base_fingerprint, adapter)
            self._set(resolved_version, str(directory), served, adapted=True)

        self.engine.run_exclusive(load)
        logger.info("loaded LoRA adapter `%s` from %s", name, directory)
        return self.info()

    def unload_lora(self, name: str) -> WeightInfo:
        if self._adapter is None or self._adapter.name != name:
            raise WeightLoadError(f"adapter `{name}` is not loaded")

        def unload() -> None:
            apply_lora(self.engine.model, self._base_weights, None)
            self._adapter = None
            self._set(self._version, self._weight_dir, self._base_fingerprint)

        self.engine.run_exclusive(unload)
        return self.info()

    def _set(
        self,
        version: int,
        weight_dir: str | None,
        fingerprint: str | None = None,
        adapted: bool = False,
    ) -> None:
        """Called on the engine thread, between steps: tokens sampled from now on carry it.
        `fingerprint`: of the weights as given; None: of the engine's weights as they are.
        `adapted`: an adapter is merged into them (else they are the base of the next one)."""
        self.engine.weight_version = version
        self.engine.forget_prefixes()  # keys and values of the old weights
        fingerprint = fingerprint or self._compute_fingerprint()
        if not adapted:
            self._base_fingerprint = fingerprint
        with self._lock:
            self._version = version
            self._weight_dir = weight_dir
            self._fingerprint = fingerprint
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
