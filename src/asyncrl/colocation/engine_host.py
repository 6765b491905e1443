"""`deployment: colocated`: the inference engine and its HTTP server live in the trainer's
process and take turns with training on one device.

While the trainer waits for a batch the engine generates. For the step it sleeps: paused, its
KV cache freed, sequences in flight kept to be recomputed. After the step it takes the new
weights straight from the trainer's parameters — the same tensors when the engine serves the
trainer's dtype, else a copy; LoRA adapters merged — and wakes. `/weight_info` reports the
version and fingerprint as any server does, so the orchestrator, which still talks HTTP to it,
cannot tell the difference.

The engine is the embedded one, or with `inference.backend: vllm` vLLM's own engine run in this
process (`inference/vllm_inprocess.py`) behind the same server; it takes every weight, LoRA
merged, through vLLM's in-place reload.
"""

from __future__ import annotations

import threading
import time

import torch
import uvicorn

from asyncrl.config.base import ConfigError
from asyncrl.config.inference import InferenceConfig
from asyncrl.inference.access import log_access, server_api_key
from asyncrl.inference.served_model import ServedModel
from asyncrl.inference.server import EngineFailed, build_app, load_served_model
from asyncrl.log import get_logger
from asyncrl.monitor.peak_memory import PhasePeaks
from asyncrl.trainer.policy_weights import check_names, policy_tensors, share_storage
from asyncrl.trainer.quantized_base import is_quantized

logger = get_logger(__name__)

STARTUP_TIMEOUT_S = 120.0


def vllm_served_model(config: InferenceConfig) -> ServedModel:
    """vLLM's engine in this process behind asyncrl's server. Weights arrive only in memory
    from the trainer: LoRA adapters come merged, never as files."""
    from asyncrl.inference.vllm_inprocess import VllmInprocessEngine

    engine = VllmInprocessEngine(config)
    name = config.served_model_name or config.model
    return ServedModel(engine, name, config.weight_roots, enable_lora=False, max_lora_rank=None)


class ColocatedInference:
    def __init__(self, config: InferenceConfig, model: torch.nn.Module, version: int) -> None:
        """Start serving `model` (weights version `version`: 0, or the step resumed from)."""
        # off loopback without a key: refused before any model loads
        log_access(config, server_api_key(config))
        if config.quantization != "none":
            raise ConfigError(
                f"inference.quantization {config.quantization}: a colocated engine shares the "
                "trainer's weights; serve int8 rollouts with `deployment: disaggregated`"
            )
        self.vllm = config.backend == "vllm"
        self.served = (
            vllm_served_model(config) if self.vllm else load_served_model(config, input_major=False)
        )
        self.engine = self.served.engine
        if not self.vllm:  # vLLM's names differ (fused q/k/v); its loader checks them itself
            check_names(policy_tensors(model), self.engine.model)
            shared = share_storage(self.engine.model, model)
            total = sum(1 for _ in self.engine.model.parameters())
            logger.info(
                "colocated: the engine shares %d of its %d parameter tensors with the trainer%s",
                shared, total, "" if shared == total else " (the others are copied each step)",
            )  # fmt: skip
        self.served.apply_received(version, self._tensors(model), source="memory")
        self.kv_cache_bytes = self.engine.kv_cache_bytes()
        self.peaks = PhasePeaks(next(model.parameters()).device)
        self.server = uvicorn.Server(
            uvicorn.Config(
                build_app(config, self.served),
                host=config.host,
                port=config.port,
                log_level="warning",
                limit_concurrency=config.max_connections,
                timeout_graceful_shutdown=config.shutdown_timeout,
            )
        )
        self.thread = threading.Thread(
            target=self.server.run, name="asyncrl-colocated-server", daemon=True
        )
        self.thread.start()
        self._wait_started(config)

    def _wait_started(self, config: InferenceConfig) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(
                    f"the colocated inference server could not start on {config.host}:"
                    f"{config.port} (is the port in use?)"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"the colocated inference server did not start in "
                                   f"{STARTUP_TIMEOUT_S:.0f} s")  # fmt: skip
            time.sleep(0.05)
        logger.info("colocated: serving %s on http://%s:%d inside the trainer",
                    self.served.name, config.host, config.port)  # fmt: skip

    def check(self) -> None:
        """The trainer, waiting for a batch, stops if the engine gave up (its steps kept
        failing): the error ends the trainer's process, which a supervisor restarts."""
        if self.engine.failure is not None:
            raise EngineFailed(f"the colocated inference engine stopped: {self.engine.failure}")

    def busy_seconds(self) -> float:
        """Seconds the engine has spent generating since it started."""
        return self.engine.stats.busy_seconds

    def sleep(self) -> dict[str, float]:
        """Before a training step: the engine stops and hands its KV cache back."""
        self.check()
        started = time.perf_counter()
        freed = self.engine.sleep()
        metrics = {"colocated/sleep_seconds": time.perf_counter() - started,
                   "colocated/kv_cache_freed_bytes": float(freed)}  # fmt: skip
        generation_peak = self.peaks.take()
        if generation_peak is not None:
            metrics["colocated/peak_memory_generation_bytes"] = float(generation_peak)
        return metrics

    def wake(self, step: int, model: torch.nn.Module) -> dict[str, float]:
        """After training step `step`: the engine takes weights version `step` and resumes."""
        started = time.perf_counter()
        training_peak = self.peaks.take()
        self.served.apply_received(step, self._tensors(model), source="memory")
        self.engine.wake()
        metrics = {"colocated/weight_sync_seconds": time.perf_counter() - started,
                   "inference/kv_cache_bytes": float(self.kv_cache_bytes)}  # fmt: skip
        if training_peak is not None:
            metrics["colocated/peak_memory_training_bytes"] = float(training_peak)
        return metrics

    def _tensors(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """vLLM takes every weight; a QLoRA trainer's engine takes its whole dequantized base
        (the layers LoRA does not adapt are quantized too)."""
        return policy_tensors(model, complete=self.vllm or is_quantized(model))

    def close(self) -> None:
        """End requests in flight, stop the server, then the engine."""
        self.engine.close()
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.engine.shutdown()
