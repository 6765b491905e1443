"""Keys and values of finished sequences, kept for later requests that begin with the same tokens.

A multi-turn episode sends its whole history again at every turn; with the cache, only the new
tokens are prefilled. A finished sequence leaves its slot to the cache instead of freeing it:
the slot holds the keys and values of its prompt and output but the last token. A new sequence
whose tokens begin with an entry's copies that prefix into its own slot (or takes the slot over
when no other is free) and prefills the rest. Entries are evicted least recently used first
whenever a running sequence needs a slot, so the cache only ever holds slots nobody else wants,
and all are dropped on a weight change: keys computed by other weights are not these weights'.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from asyncrl.inference.kv_cache import SlotKVCache


@dataclass(eq=False)
class CachedPrefix:
    slot: int
    token_ids: list[int]  # the tokens whose keys and values are at positions 0.. of the slot
    last_used: int


def common_length(a: list[int], b: list[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


class PrefixCache:
    def __init__(self, cache: SlotKVCache) -> None:
        self.cache = cache
        self.entries: list[CachedPrefix] = []
        self.version = 0  # the weights every entry was computed with
        self._clock = itertools.count()
        self.hit_tokens = 0  # tokens not prefilled thanks to the cache

    def keep(self, slot: int, token_ids: list[int], version: int) -> None:
        """Take over `slot` of a finished sequence; entries it extends are dropped."""
        self.drop_unless(version)
        for entry in [e for e in self.entries if token_ids[: len(e.token_ids)] == e.token_ids]:
            self._drop(entry)
        self.entries.append(CachedPrefix(slot, list(token_ids), next(self._clock)))

    def match(self, token_ids: list[int], version: int) -> tuple[CachedPrefix, int] | None:
        """The entry sharing the longest prefix with `token_ids`, and how many tokens it
        covers: at most all but the last, whose logits the prefill must still compute."""
        self.drop_unless(version)
        best: tuple[CachedPrefix, int] | None = None
        for entry in self.entries:
            length = min(common_length(entry.token_ids, token_ids), len(token_ids) - 1)
            if length > 0 and (best is None or length > best[1]):
                best = (entry, length)
        if best is not None:
            best[0].last_used = next(self._clock)
        return best

    def take(self, entry: CachedPrefix) -> int:
        """Hand `entry`'s slot to a sequence (no other slot is free)."""
        self.entries.remove(entry)
        return entry.slot

    def evict_one(self) -> bool:
        """Free the least recently used entry's slot; False if there is none."""
        if not self.entries:
            return False
        self._drop(min(self.entries, key=lambda e: e.last_used))
        return True

    def drop_unless(self, version: int) -> None:
        """Drop every entry when the weights are no longer those they were computed with."""
        if version != self.version:
            self.clear()
            self.version = version

    def clear(self) -> None:
        for entry in list(self.entries):
            self._drop(entry)

    def _drop(self, entry: CachedPrefix) -> None:
        self.entries.remove(entry)
        self.cache.release(entry.slot)
