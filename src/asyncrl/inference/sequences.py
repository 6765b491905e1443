"""What the engine tracks per request and per sequence, and what it hands back."""

from __future__ import annotations

import itertools
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from asyncrl.inference.sampling import SamplingParams, SequenceView

_PROMPT_KEYS = itertools.count()


def fresh_prompt_keys() -> int:
    """A `Sequence.prompt_keys` no other sequence has: its prompt was prefilled on its own."""
    return next(_PROMPT_KEYS)


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    text: str
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    finish_reason: str  # "stop" | "length" | "abort"
    stop_reason: str | int | None
    policy_versions: list[int]  # weights version in effect when each token was sampled


@dataclass(eq=False)  # identity: sequences are compared and removed in the hot loop
class Sequence:
    request: Request
    index: int
    generator: torch.Generator | None
    slot: int | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    text: str = ""
    cached: int = 0  # leading tokens whose keys and values came from the prefix cache
    # equal in sequences whose prompt keys and values are copies of one prefill (siblings of a
    # shared prompt): a decode pass reads them once per group (`cascade_attention.py`)
    prompt_keys: int = field(default_factory=fresh_prompt_keys)

    @property
    def token_ids(self) -> list[int]:
        return self.request.prompt_ids + self.output_ids

    @property
    def prefill_len(self) -> int:
        """Tokens a prefill runs: the prompt, plus the outputs of a sequence preempted by
        `Engine.sleep` (their keys and values were freed), less what the prefix cache gave."""
        return len(self.request.prompt_ids) + len(self.output_ids) - self.cached

    @property
    def cached_len(self) -> int:
        """Tokens whose keys/values are in the cache: the prompt and all outputs but the last."""
        return len(self.request.prompt_ids) + max(0, len(self.output_ids) - 1)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    n: int
    done: Future[list[CompletionOutput]]
    sequences: list[Sequence] = field(default_factory=list)
    arrival: float = field(default_factory=time.monotonic)


def completion_output(sequence: Sequence) -> CompletionOutput:
    return CompletionOutput(
        index=sequence.index,
        token_ids=list(sequence.output_ids),
        text=sequence.text,
        logprobs=list(sequence.logprobs),
        top_logprobs=list(sequence.top_logprobs),
        finish_reason=sequence.finish_reason or "abort",
        stop_reason=sequence.stop_reason,
        policy_versions=list(sequence.versions),
    )


def sampling_views(sequences: list[Sequence], no_history: torch.Tensor) -> list[SequenceView]:
    """What sampling needs of each sequence: its prompt and output ids only where a repetition
    penalty reads them (built per step, they would cost a tensor per row for nothing), else the
    empty `no_history` (on the engine's device)."""
    if all(s.request.params.repetition_penalty == 1.0 for s in sequences):
        return [SequenceView(s.request.params, no_history, len(s.output_ids), s.generator)
                for s in sequences]  # fmt: skip
    return [
        SequenceView(
            s.request.params,
            torch.tensor(s.request.prompt_ids + s.output_ids, device=no_history.device),
            len(s.output_ids),
            s.generator,
        )
        for s in sequences
    ]
