"""A slot-based KV cache: each running sequence owns one slot; sequences join and leave freely.

Keys and values live in preallocated tensors [slots, kv_heads, max_len, head_dim] per layer, each
sequence's tokens at positions 0..length-1 of its slot (no padding inside a sequence). A forward
pass names the slots it runs and the position its new tokens start at; the model's attention
calls `update`, which writes the new keys/values there and returns the keys/values of those slots
up to the longest one. A 4-D boolean mask built by `attention_mask` hides each slot's unused
tail and keeps attention causal, so rows of different lengths share one batched pass.

It is passed to a transformers model as `cache` (`past_key_values` before 5.24): in transformers 5
the attention layers only call `update(key_states, value_states, layer_idx)`, and a ready 4-D
mask is used as is.
"""

from __future__ import annotations

import os
from typing import Any

import torch


def slot_bytes(config: Any, max_len: int, dtype: torch.dtype) -> int:
    """Bytes one slot of `max_len` positions takes: keys and values of every layer."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    size = torch.empty(0, dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * kv_heads * max_len * head_dim * size


def default_budget(device: torch.device) -> int:
    """A quarter of the machine's memory; on a GPU, half of what is free."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free // 2)
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4


class SlotKVCache:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        self.shape = (num_slots, num_kv_heads, max_len, head_dim)
        self.num_layers = num_layers
        self.dtype = dtype
        self.device = torch.device(device)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.reserve_memory()
        self.num_slots = num_slots
        self.max_len = max_len
        self.free_slots = list(range(num_slots - 1, -1, -1))
        # set by `prepare` before each forward pass
        self._slots = torch.zeros(0, dtype=torch.long, device=self.device)
        self._starts = torch.zeros(0, dtype=torch.long, device=self.device)
        self._kv_len = 0
        self._contiguous: slice | None = None
        self._whole_layers: frozenset[int] = frozenset()

    # memory -------------------------------------------------------------------------------------
    def reserve_memory(self) -> None:
        """Allocate the keys and values (at start, and when a colocated engine wakes)."""
        if not self.keys:
            self.keys = [self._zeros() for _ in range(self.num_layers)]
            self.values = [self._zeros() for _ in range(self.num_layers)]

    def release_memory(self) -> int:
        """Free the keys and values while no sequence holds a slot (a colocated engine goes to
        sleep so the trainer can use the memory); returns the bytes freed."""
        if self.used_slots:
            raise RuntimeError(f"{self.used_slots} sequence(s) still hold KV cache slots")
        freed = self.nbytes
        self.keys, self.values = [], []
        return freed

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.keys, *self.values])

    def _zeros(self) -> torch.Tensor:
        return torch.zeros(self.shape, dtype=self.dtype, device=self.device)

    # slot bookkeeping -------------------------------------------------------------------------
    def allocate(self) -> int:
        if not self.free_slots:
            raise RuntimeError("no free KV cache slot")
        return self.free_slots.pop()

    def release(self, slot: int) -> None:
        self.free_slots.append(slot)

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Give slot `target` the keys and values of slot `source`'s first `length` positions
        (a shared prompt, prefilled once)."""
        for keys, values in zip(self.keys, self.values, strict=True):
            keys[target, :, :length] = keys[source, :, :length]
            values[target, :, :length] = values[source, :, :length]

    @property
    def used_slots(self) -> int:
        return self.num_slots - len(self.free_slots)

    # one forward pass ---------------------------------------------------------------------------
    def prepare(
        self,
        slots: list[int],
        starts: list[int],
        num_new: int,
        whole_layers: frozenset[int] = frozenset(),
    ) -> None:
        """The next forward writes `num_new` tokens per row at positions starts[i].. of slots[i].
        `whole_layers`: layers whose attention reads the cache itself (`cascade_attention.py`):
        `update` returns their whole keys and values, gathering nothing."""
        self._whole_layers = whole_layers
        self._slots = torch.tensor(slots, dtype=torch.long, device=self.device)
        self._starts = torch.tensor(starts, dtype=torch.long, device=self.device)
        self._num_new = num_new
        self._kv_len = max(starts) + num_new
        if self._kv_len > self.max_len:
            raise ValueError(
                f"sequence would reach {self._kv_len} tokens, cache holds {self.max_len}"
            )
        first = slots[0]
        is_range = slots == list(range(first, first + len(slots)))
        self._contiguous = slice(first, first + len(slots)) if is_range else None

    def attention_mask(self) -> torch.Tensor:
        """[rows, 1, num_new, kv_len] bool: query j of row i (at position starts[i]+j) sees keys
        at positions <= starts[i]+j. Keys beyond belong to other sequences' past or are unused."""
        query_positions = self.position_ids()  # [rows, new]
        key_positions = torch.arange(self._kv_len, device=self.device)
        return (key_positions.view(1, 1, -1) <= query_positions.unsqueeze(-1)).unsqueeze(1)

    def position_ids(self) -> torch.Tensor:
        return self._starts.unsqueeze(1) + torch.arange(self._num_new, device=self.device)

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: object,
        **kwargs: object,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[rows, kv_heads, num_new, head_dim] in -> [rows, kv_heads, kv_len, head_dim] out.
        Whatever else the model passes (`cache_kwargs` positionally in transformers 5.23 and
        before, `kwargs=` from 5.24) is not needed here: slots and positions are set per step."""
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self._num_new == 1:
            keys[self._slots, :, self._starts] = key_states[:, :, 0]
            values[self._slots, :, self._starts] = value_states[:, :, 0]
        else:
            for row in range(len(self._slots)):
                slot, start = int(self._slots[row]), int(self._starts[row])
                keys[slot, :, start : start + self._num_new] = key_states[row]
                values[slot, :, start : start + self._num_new] = value_states[row]
        if layer_idx in self._whole_layers:
            return keys, values
        if self._contiguous is not None:
            return keys[self._contiguous, :, : self._kv_len], values[
                self._contiguous, :, : self._kv_len
            ]
        return keys[self._slots, :, : self._kv_len], values[self._slots, :, : self._kv_len]

    # what transformers may ask of a cache --------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    @property
    def is_compileable(self) -> bool:
        return False
