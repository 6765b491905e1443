"""How admitted sequences are prefilled: in passes that fit the KV cache, and with a request's
n fresh sequences running their shared prompt once."""

from __future__ import annotations

from asyncrl.inference.sequences import Sequence


def prefill_groups(sequences: list[Sequence], max_len: int) -> list[list[Sequence]]:
    """Admitted sequences split into prefill passes that fit the cache: one pass writes every
    row's new tokens from that row's start, so its longest start plus its widest row must not
    pass `max_len` (rows resuming from cached prefixes have starts far from 0)."""
    groups: list[list[Sequence]] = []
    start = width = 0
    for sequence in sequences:
        wider = max(start, sequence.cached) + max(width, sequence.prefill_len)
        if groups and wider <= max_len:
            groups[-1].append(sequence)
            start, width = max(start, sequence.cached), max(width, sequence.prefill_len)
        else:
            groups.append([sequence])
            start, width = sequence.cached, sequence.prefill_len
    return groups


def share_prompts(sequences: list[Sequence]) -> tuple[list[Sequence], list[int]]:
    """The sequences a prefill runs (one per request among its fresh sequences; a preempted
    sequence, with tokens of its own, runs alone) and, for every sequence, the run row whose
    prompt it shares."""
    run: list[Sequence] = []
    source: list[int] = []
    leaders: dict[int, int] = {}
    for sequence in sequences:
        shares = not sequence.output_ids
        key = id(sequence.request)
        if shares and key in leaders:
            source.append(leaders[key])
            continue
        if shares:
            leaders[key] = len(run)
        source.append(len(run))
        run.append(sequence)
    return run, source
