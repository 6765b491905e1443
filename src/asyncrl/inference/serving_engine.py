"""What the HTTP server needs of an engine, so one server fronts two: the embedded engine
(`engine.py`) and, in a colocated trainer, vLLM's engine running in the same process
(`vllm_inprocess.py`). Routes, weight versions and metrics are then the same for both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerBase

from asyncrl.inference.engine_stats import EngineStats
from asyncrl.inference.sampling import SamplingParams
from asyncrl.inference.sequences import Request
from asyncrl.types import PauseMode


class ServingEngine(Protocol):
    tokenizer: PreTrainedTokenizerBase
    model: torch.nn.Module
    max_model_len: int
    weight_version: int  # set between steps; every token sampled after carries it
    stats: EngineStats
    failure: str | None  # why the engine gave up (its steps kept failing), once it has
    on_failure: Callable[[str], None] | None  # told that reason, once
    # whether `model`'s parameters hold installed weights as given, so a copy can be compared
    # with its source (vLLM's do not: fused, and on a CPU repacked for its kernels)
    parameters_as_installed: bool

    def submit(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> Request: ...

    def abort(self, request: Request) -> None: ...

    def run_exclusive(self, operation: Callable[[], Any], timeout: float | None = None) -> Any: ...

    def install(self, tensors: dict[str, torch.Tensor], take: bool = False) -> None:
        """Weights in Hugging Face names into the model (on the engine thread); `take`: the
        tensors were staged for the engine, which may keep them instead of copying."""
        ...

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The weights served, in Hugging Face names: what `/weight_info` fingerprints."""
        ...

    def give_up(self, reason: str) -> None:
        """Stop serving for good: requests aborted, `failure` set, `on_failure` told."""
        ...

    def pause(self, mode: PauseMode) -> None: ...

    def resume(self) -> None: ...

    def sleep(self) -> int:
        """Pause and free the KV cache for a trainer on the same device; the bytes freed."""
        ...

    def wake(self) -> None: ...

    def forget_prefixes(self) -> None: ...

    @property
    def is_paused(self) -> bool: ...

    def load(self) -> tuple[int, int]:
        """(running sequences, waiting sequences)."""
        ...

    def kv_cache_bytes(self) -> int:
        """The KV cache's size while awake."""
        ...

    def kv_cache_usage(self) -> float:
        """The fraction of the KV cache running sequences hold."""
        ...

    def prefix_cache_counts(self) -> tuple[int, int]:
        """(cached prefixes, prompt tokens served from the cache since start)."""
        ...

    def close(self) -> None: ...

    def shutdown(self) -> None: ...
