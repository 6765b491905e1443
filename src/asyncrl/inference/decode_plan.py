"""How running sequences are decoded: in one pass, or in several when their lengths spread.

A decode pass gathers every row's keys and values up to the pass's longest sequence and attends
over all of them (`kv_cache.py`), so one long sequence makes every row pay for its length: with
one row at 500 tokens and 31 at 40, a step of the `small` model took 2.45× as long as with all
32 at 40 (benchmarks/RESULTS.md, 2026-11-25; its script retired, at `f4f160d`). With long-tailed
answer lengths a long sequence is nearly always running. Another pass has a cost of its own
(the model's fixed per-layer work and the sampling around it: 6.5 ms for one row of `small` on
one core, against 1.4 µs per row and key position), so rows are split off only where the key
positions they stop attending to outweigh it.
"""

from __future__ import annotations

from asyncrl.inference.sequences import Sequence

# Key positions (rows × tokens no longer attended to) that repay one more forward pass: the
# fixed cost of a pass over the cost per row and key position, fitted on `small` (6 layers, 2 KV
# heads of 64, bf16, one core): 6.3 ms / 1.37 µs ≈ 4,600, rounded down. A wrong value costs
# speed, not tokens: every row attends to exactly its own keys either way.
SPLIT_WORTH_KEY_POSITIONS = 4096


def decode_passes(
    sequences: list[Sequence], worth: int = SPLIT_WORTH_KEY_POSITIONS
) -> list[list[Sequence]]:
    """`sequences` in decode passes, shortest first, each keeping their order in `sequences`
    (consecutive slots stay consecutive): split at the length that spares the most key
    positions while that exceeds `worth`, and each part again the same way."""
    if len(sequences) < 2:
        return [sequences] if sequences else []
    ordered = sorted(sequences, key=lambda s: s.cached_len)
    parts = _split([s.cached_len for s in ordered], 0, len(ordered), worth)
    if len(parts) == 1:
        return [sequences]
    pass_of = {id(s): index for index, (start, end) in enumerate(parts)
               for s in ordered[start:end]}  # fmt: skip
    passes: list[list[Sequence]] = [[] for _ in parts]
    for sequence in sequences:
        passes[pass_of[id(sequence)]].append(sequence)
    return passes


def _split(lengths: list[int], start: int, end: int, worth: int) -> list[tuple[int, int]]:
    """[start, end) of the sorted `lengths` as (start, end) parts."""
    longest = lengths[end - 1]
    spared, at = 0, start
    for cut in range(start + 1, end):  # rows [start, cut) go to a pass of their own
        saving = (cut - start) * (longest - lengths[cut - 1])
        if saving > spared:
            spared, at = saving, cut
    if spared <= worth:
        return [(start, end)]
    return _split(lengths, start, at, worth) + _split(lengths, at, end, worth)
