"""How admitted sequences are prefilled: in passes that fit the KV cache, with a request's n
fresh sequences running their shared prompt once, and with the head that several requests'
prompts begin with (a system prompt) run once for all of them."""

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


MIN_SHARED_HEAD = 16  # tokens: a shorter common head is not worth a pass of its own


def shared_head(sequences: list[Sequence]) -> tuple[list[Sequence], int]:
    """The sequences that lead their request's prefill (its first fresh sequence, with nothing
    from the prefix cache) and the length of the head all their prompts begin with, where two
    requests or more share at least `MIN_SHARED_HEAD` tokens; else ([], 0).

    The quick start's requests are a 65-token chat prompt of which the first ~55 (the system
    prompt and the template) are the same for every problem: prefilled apart, four requests
    cost 260 tokens; with the head once, 65 + 3 × 10. Each prompt keeps at least its last token
    to prefill, whose logits its first sample comes from."""
    leaders: list[Sequence] = []
    seen: set[int] = set()
    for sequence in sequences:
        key = id(sequence.request)
        if key in seen or sequence.output_ids:
            continue
        seen.add(key)
        if sequence.cached == 0:
            leaders.append(sequence)
    if len(leaders) < 2:
        return [], 0
    first = leaders[0].request.prompt_ids
    length = min(len(s.request.prompt_ids) for s in leaders) - 1
    for sequence in leaders[1:]:
        prompt = sequence.request.prompt_ids
        length = next((i for i in range(length) if prompt[i] != first[i]), length)
    if length < MIN_SHARED_HEAD:
        return [], 0
    return leaders, length
