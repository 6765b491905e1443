"""The embedded engine: continuous batching over a slot KV cache, in one background thread.

Each loop iteration (1) runs queued control operations (weight loads) between steps, (2) admits
waiting sequences into free cache slots and prefills them in one batched pass, and (3) advances
every running sequence by one token in one batched decode pass. New requests therefore join the
running batch between decode steps, and finished ones leave it at once.
"""

from __future__ import annotations

import inspect
import time
from collections import deque
from collections.abc import Iterable

import torch
from transformers import PreTrainedTokenizerBase

from asyncrl.inference.blocked_head import use_blocked_head
from asyncrl.inference.cascade_attention import (
    PLAN_ARGUMENT,
    CascadePlan,
    PlanIgnored,
    attending_by,
    plan_cascade,
    use_cascade_attention,
)
from asyncrl.inference.decode_plan import decode_passes
from asyncrl.inference.engine_stats import EngineStats
from asyncrl.inference.engine_thread import EngineThread
from asyncrl.inference.int8_linears import requantize
from asyncrl.inference.kv_cache import SlotKVCache
from asyncrl.inference.prefill_plan import prefill_groups, share_prompts, shared_head
from asyncrl.inference.prefix_cache import PrefixCache
from asyncrl.inference.sampling import SampleResult, SequenceView, sample, sample_rows_apart
from asyncrl.inference.sequences import (
    Request,
    Sequence,
    completion_output,
    fresh_prompt_keys,
    sampling_views,
)
from asyncrl.log import get_logger
from asyncrl.models.attention_layers import check_attention_layers, layer_masks

logger = get_logger(__name__)


class Engine(EngineThread):
    borrows_cores = True
    parameters_as_installed = True  # a copied weight can be compared with its source

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_num_seqs: int,
        max_model_len: int,
        max_num_batched_tokens: int = 8192,
        share_prompts: bool = True,
        prefix_caching: bool = False,
        cascade: bool = True,
    ) -> None:
        """`share_prompts`: a request's n sequences prefill its prompt once (off: n times, for
        comparison). `prefix_caching`: finished sequences' keys and values serve later requests
        that begin with the same tokens (`prefix_cache.py`). `cascade`: decode passes read a
        shared prompt's keys once per group where the model allows (off: once per row, for
        comparison)."""
        super().__init__("asyncrl-engine")
        self.model = model.eval()
        use_blocked_head(model)  # on a CPU: Gemma 3's decode pass 1.13–1.18x faster
        # a group's shared prompt read once per decode pass, not once per row (CPU float32)
        self.cascade = cascade and use_cascade_attention(model)
        self.share_prompts = share_prompts
        self.tokenizer = tokenizer
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)
        self.device = next(model.parameters()).device  # every tensor the engine makes goes here
        self._no_history = torch.zeros(0, dtype=torch.long, device=self.device)
        config = model.config
        check_attention_layers(config, "the embedded engine")
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.cache = SlotKVCache(
            num_layers=config.num_hidden_layers,
            num_slots=max_num_seqs,
            num_kv_heads=getattr(config, "num_key_value_heads", config.num_attention_heads),
            max_len=max_model_len,
            head_dim=head_dim,
            dtype=next(model.parameters()).dtype,
            device=self.device,
        )
        self.prefix_cache = PrefixCache(self.cache) if prefix_caching else None
        # transformers 5.24 renamed the argument (`past_key_values` is deprecated there)
        forward_arguments = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in forward_arguments else "past_key_values"
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos_ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
            eos_ids.append(tokenizer.eos_token_id)
        self.eos_token_ids: list[int] = eos_ids
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self.weight_version = 0  # set between steps by whoever loads weights (run_exclusive)
        self.stats = EngineStats()
        self._thread.start()

    # the engine's part of EngineThread ---------------------------------------------------------
    def _new_sequence(self, request: Request, index: int) -> Sequence:
        params = request.params
        generator = None
        if params.seed is not None and not params.greedy:
            generator = torch.Generator(self.device).manual_seed(params.seed + index)
        return Sequence(request, index, generator)

    def _enqueue(self, sequences: Iterable[Sequence]) -> None:
        self._waiting.extend(sequences)

    def _unfinished(self) -> list[Sequence]:
        return [s for s in [*self._running, *self._waiting] if s.finish_reason is None]

    def _has_steps(self) -> bool:
        return not self._paused and bool(self._running or self._waiting)

    # public, thread-safe -------------------------------------------------------------------------
    def sleep(self) -> int:
        """Pause and free the KV cache, so a trainer in the same process can have the device;
        returns the bytes freed. Running sequences go back to the head of the queue and keep
        their tokens: on `wake` their prompt and tokens so far are prefilled again (vLLM's
        recompute preemption), and the rest is sampled with the weights then in place."""
        self.pause("keep")

        def preempt_and_free() -> int:
            self.forget_prefixes()
            with self._condition:
                preempted = [s for s in self._running if s.finish_reason is None]
                for sequence in self._running:
                    if sequence.slot is not None:
                        self.cache.release(sequence.slot)
                        sequence.slot, sequence.cached = None, 0
                self._running.clear()
                self._waiting.extendleft(reversed(preempted))
            return self.cache.release_memory()

        return self.run_exclusive(preempt_and_free)

    def wake(self) -> None:
        """Reallocate the KV cache and resume: preempted sequences are recomputed first."""
        self.run_exclusive(self.cache.reserve_memory)
        self.resume()

    def forget_prefixes(self) -> None:
        """Drop the prefix cache: on the engine thread (`run_exclusive`), whenever weights
        change."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def install(self, tensors: dict[str, torch.Tensor], take: bool = False) -> None:
        """Weights by parameter name; a tensor that already is the parameter's storage (a
        colocated trainer's, shared) is not copied. `take`: the tensors are the engine's to
        keep (staged for it), so one of the parameter's dtype and device becomes its storage
        instead of being copied. Int8 layers are quantized again from the new float weights
        (`int8_linears.py`); a shared tensor too, which its owner may have changed in place.
        Call on the engine thread."""
        parameters = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in tensors.items():
                parameter = parameters[name]
                if parameter.data_ptr() == tensor.data_ptr():
                    continue
                # the stride too: an input-major weight stays so (`input_major.py`)
                same_kind = (tensor.dtype, tensor.device, tensor.shape, tensor.stride()) == (
                    parameter.dtype, parameter.device, parameter.shape, parameter.stride(),
                )  # fmt: skip
                if take and same_kind:
                    parameter.data = tensor
                else:
                    parameter.copy_(tensor)
        requantize(self.model, [parameters[name] for name in tensors])

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        return self.model.named_parameters()

    def load(self) -> tuple[int, int]:
        """(running sequences, waiting sequences)."""
        with self._condition:
            held = sum(len(r.sequences) for r in self._held)
            return len(self._running), len(self._waiting) + held

    def kv_cache_bytes(self) -> int:
        return self.cache.nbytes

    def kv_cache_usage(self) -> float:
        cached = len(self.prefix_cache.entries) if self.prefix_cache is not None else 0
        return (self.cache.used_slots - cached) / self.cache.num_slots

    def prefix_cache_counts(self) -> tuple[int, int]:
        if self.prefix_cache is None:
            return 0, 0
        return len(self.prefix_cache.entries), self.prefix_cache.hit_tokens

    # the loop ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _step(self) -> None:
        if self._paused:
            return
        started = time.perf_counter()
        admitted = self._admit()
        if self.share_prompts:
            self._prefill_shared_head(admitted)
        produced = 0
        for group in prefill_groups(admitted, self.max_model_len):
            self._forward(group, prefill=True)
        produced += len(admitted)
        new = {id(s) for s in admitted}
        decoding = [s for s in self._running if id(s) not in new and s.finish_reason is None]
        for batch in decode_passes(decoding):
            live = [s for s in batch if s.finish_reason is None]  # not aborted meanwhile
            # in slot order: rows holding a range of slots read their keys in place, where in
            # any other order every pass copied every row's keys (finished sequences free
            # their slots in any order, and new ones take them last freed first)
            live.sort(key=lambda s: -1 if s.slot is None else s.slot)  # None: aborted just now
            if live:
                self._forward(live, prefill=False)
                produced += len(live)
        self.stats.record(produced, time.perf_counter() - started, self.borrowing)

    def _admit(self) -> list[Sequence]:
        """Move waiting sequences into free slots, up to the prefill token budget."""
        admitted: list[Sequence] = []
        budget = self.max_num_batched_tokens
        requests: set[int] = set()  # a later sibling copies the prompt from the first one
        cached = self.prefix_cache.entries if self.prefix_cache is not None else []
        with self._condition:
            while self._waiting and (self.cache.free_slots or cached):
                sequence = self._waiting[0]
                if sequence.finish_reason is not None:
                    self._waiting.popleft()
                    continue
                cost = sequence.prefill_len
                if admitted and cost > budget:
                    break
                self._waiting.popleft()
                sibling = self.share_prompts and not sequence.output_ids and (
                    id(sequence.request) in requests
                )  # fmt: skip
                requests.add(id(sequence.request))
                sequence.slot = self._slot_for(sequence, look_up=not sibling)
                self._running.append(sequence)
                admitted.append(sequence)
                budget -= sequence.prefill_len
        return admitted

    def _slot_for(self, sequence: Sequence, look_up: bool) -> int:
        """A slot for `sequence`, holding the longest cached prefix of its tokens if any
        (`sequence.cached`); the least recently used cache entry makes room when none is free."""
        sequence.cached = 0  # a sequence preempted by a sleep had its cached keys freed
        prefixes = self.prefix_cache
        if prefixes is None:
            return self.cache.allocate()
        found = prefixes.match(sequence.token_ids, self.weight_version) if look_up else None
        if found is None:
            if not self.cache.free_slots:
                prefixes.evict_one()
            return self.cache.allocate()
        entry, length = found
        sequence.cached = length
        prefixes.hit_tokens += length
        if not self.cache.free_slots:
            return prefixes.take(entry)
        slot = self.cache.allocate()
        self.cache.copy_prefix(entry.slot, slot, length)
        return slot

    def _forward(self, sequences: list[Sequence], *, prefill: bool) -> None:
        # another thread may abort a sequence at any moment, which frees its slot: the live
        # sequences and their slots are taken together. A slot freed after this is handed out by
        # nothing before the next `_admit` (this thread), so keys written into it harm no one.
        with self._condition:
            sequences = [s for s in sequences if s.finish_reason is None]
            held: dict[int, int] = {id(s): s.slot for s in sequences}  # type: ignore[misc]
        if not sequences:
            return
        # a request's n fresh sequences share its prompt: one of them runs it, the others get
        # a copy of its keys and values and sample from its last logits (`source`)
        shares = prefill and self.share_prompts
        run, source = share_prompts(sequences) if shares else (sequences, None)
        if prefill:  # the prompt (and a preempted sequence's tokens) after any cached prefix
            lengths = [s.prefill_len for s in run]
            width = max(lengths)
            rows = [s.token_ids[s.cached :] + [0] * (width - length) for s, length in
                    zip(run, lengths, strict=True)]  # fmt: skip
            starts = [s.cached for s in run]
        else:
            lengths = [1] * len(run)
            width = 1
            rows = [[s.output_ids[-1]] for s in run]
            starts = [s.cached_len for s in run]
        slots = [held[id(s)] for s in run]
        plan = None  # a decode pass reads each shared prompt's keys once (cascade_attention.py)
        if self.cascade and not prefill:
            prompt_lens = [len(s.request.prompt_ids) for s in run]
            keys = [s.prompt_keys for s in run]
            config = self.model.config
            plan = plan_cascade(slots, starts, prompt_lens, keys, config, self.device)  # type: ignore[arg-type]
        step_logits = self._logits(rows, slots, starts, lengths, plan)  # type: ignore[arg-type]
        if prefill:  # keys computed now: no other sequence holds these
            for sequence in run:
                sequence.prompt_keys = fresh_prompt_keys()
        if source is not None and len(run) < len(sequences):
            for sequence, row in zip(sequences, source, strict=True):
                if sequence is not run[row]:
                    shared = len(sequence.request.prompt_ids)
                    self.cache.copy_prefix(slots[row], held[id(sequence)], shared)
                    sequence.prompt_keys = run[row].prompt_keys
            step_logits = step_logits[torch.tensor(source, device=self.device)]
        self.stats.prefill_tokens += sum(lengths) if prefill else 0
        views = sampling_views(sequences, self._no_history)
        result = self._sample(step_logits, views)
        tokens = result.tokens.tolist()
        chosen = result.logprobs.tolist()
        failed = set(result.failed)
        with self._condition:
            for row, sequence in enumerate(sequences):
                if sequence.finish_reason is not None:  # aborted during the forward pass
                    continue
                if row in failed:  # its own parameters broke its distribution: it alone ends
                    self._finish(sequence, "abort")
                    continue
                sequence.output_ids.append(tokens[row])
                sequence.logprobs.append(chosen[row])
                sequence.versions.append(self.weight_version)
                wanted = sequence.request.params.logprobs or 0
                if wanted and result.top_ids is not None and result.top_logprobs is not None:
                    ids = result.top_ids[row, :wanted].tolist()
                    values = result.top_logprobs[row, :wanted].tolist()
                    sequence.top_logprobs.append(list(zip(ids, values, strict=True)))
                self._check_finished(sequence)

    def _logits(
        self,
        rows: list[list[int]],
        slots: list[int],
        starts: list[int],
        lengths: list[int],
        plan: CascadePlan | None = None,
    ) -> torch.Tensor:
        """[rows, vocab]: the model over each row's new tokens (written to its slot's keys and
        values from `starts`), logits at each row's last one."""
        whole_layers = plan.layers if plan else frozenset()
        self.cache.prepare(slots, starts, max(lengths), whole_layers)
        last = torch.tensor(lengths, device=self.device) - 1
        # the LM head runs at each row's last position only (a prompt's others predict nothing):
        # at a real vocabulary it is a fifth of a token's work, and [rows, width, vocab] logits
        # of a long prefill would be hundreds of MB
        positions = torch.unique(last)  # sorted: row i's logits are at searchsorted(…, last[i])
        query_positions = self.cache.position_ids()  # [rows, width]
        mask = self.cache.attention_mask()  # [rows, 1, width, kv_len]
        key_positions = torch.arange(mask.shape[-1], device=self.device).unsqueeze(0)
        # per layer type: a sliding-window layer (Gemma 3) must not see past its window
        masks = layer_masks(self.model.config, mask, query_positions, key_positions)
        try:
            with attending_by(plan, self.model.config.model_type):
                logits = self.model(
                    input_ids=torch.tensor(rows, device=self.device),
                    position_ids=query_positions,
                    attention_mask=masks,
                    use_cache=True,
                    logits_to_keep=positions,
                    **{self._cache_argument: self.cache},
                    **({PLAN_ARGUMENT: plan} if plan else {}),
                ).logits  # [rows, len(positions), vocab]
        except PlanIgnored:
            self.cascade = False  # from now on: the model's attention does not take plans
            raise
        if len(positions) == 1:  # one position a row (every decode pass): a view, not a copy
            return logits[:, 0]
        kept = torch.searchsorted(positions, last)
        return logits[torch.arange(len(rows), device=self.device), kept]

    def _prefill_shared_head(self, admitted: list[Sequence]) -> None:
        """Where the requests admitted together begin with the same tokens (a system prompt, a
        template), run that head once in one slot, copy its keys and values to the others and
        let each prefill only the rest (`prefill_plan.shared_head`)."""
        # as in `_forward`: the live sequences and their slots at once, since an abort on
        # another thread frees a slot (nothing takes it before the next admission, on this
        # thread, so the head's keys stay readable)
        with self._condition:
            admitted = [s for s in admitted if s.finish_reason is None]
            held: dict[int, int] = {id(s): s.slot for s in admitted}  # type: ignore[misc]
        leaders, length = shared_head(admitted)
        if not leaders:
            return
        head_slot = held[id(leaders[0])]
        self._logits([leaders[0].request.prompt_ids[:length]], [head_slot], [0], [length])
        self.stats.prefill_tokens += length
        # every fresh sequence of those requests starts past the head, its siblings too: a
        # prefill pass is as wide as its longest start plus its widest row (`prefill_groups`),
        # and a sibling that a pass boundary parts from its leader prefills its own tail
        sharing = {id(sequence.request) for sequence in leaders}
        for sequence in admitted:
            if id(sequence.request) not in sharing or sequence.output_ids:
                continue
            if held[id(sequence)] != head_slot:
                self.cache.copy_prefix(head_slot, held[id(sequence)], length)
            sequence.cached = length

    def _sample(self, logits: torch.Tensor, views: list[SequenceView]) -> SampleResult:
        """Sample the batch; if that raises, row by row, so that only the rows that raise fail."""
        try:
            return sample(logits, views, self.eos_token_ids)
        except Exception:
            logger.exception("sampling the batch failed; sampling row by row")
        return sample_rows_apart(logits, views, self.eos_token_ids)

    def _check_finished(self, sequence: Sequence) -> None:
        params = sequence.request.params
        token = sequence.output_ids[-1]
        if len(sequence.output_ids) >= params.min_tokens:
            if token in params.stop_token_ids:
                return self._finish(sequence, "stop", token)
            if token in self.eos_token_ids and not params.ignore_eos:
                return self._finish(sequence, "stop")
        if params.stop and len(sequence.output_ids) >= params.min_tokens:
            text = self.tokenizer.decode(sequence.output_ids, skip_special_tokens=True)
            if stopped := params.stopped_text(text):
                sequence.text, stop = stopped
                return self._finish(sequence, "stop", stop, keep_text=True)
        total = len(sequence.request.prompt_ids) + len(sequence.output_ids)
        if len(sequence.output_ids) >= params.max_tokens or total >= self.max_model_len:
            return self._finish(sequence, "length")
        return None

    def _leave_slot(self, sequence: Sequence) -> None:
        """A finished sequence's slot goes to the prefix cache when its keys and values all
        come from the weights in place (and it was not aborted); else it is freed."""
        assert sequence.slot is not None
        prefixes = self.prefix_cache
        current = set(sequence.versions) == {self.weight_version}
        if prefixes is not None and sequence.finish_reason != "abort" and current:
            kept = sequence.token_ids[: sequence.cached_len]
            prefixes.keep(sequence.slot, kept, self.weight_version)
        else:
            self.cache.release(sequence.slot)

    def _finish(
        self,
        sequence: Sequence,
        reason: str,
        stop_reason: str | int | None = None,
        *,
        keep_text: bool = False,
    ) -> None:
        """Called with the condition held."""
        sequence.finish_reason = reason
        sequence.stop_reason = stop_reason
        if not keep_text:
            sequence.text = self.tokenizer.decode(sequence.output_ids, skip_special_tokens=True)
        if sequence in self._running:
            self._running.remove(sequence)
        if sequence.slot is not None:
            self._leave_slot(sequence)
            sequence.slot = None
        request = sequence.request
        if all(s.finish_reason is not None for s in request.sequences) and not request.done.done():
            request.done.set_result([completion_output(s) for s in request.sequences])
        self._condition.notify_all()
