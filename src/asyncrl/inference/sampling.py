"""Turn a decode step's logits into sampled tokens and their logprobs, per request.

Logprob semantics (the contract the trainer relies on): the logprob of a token is taken from the
distribution it was actually sampled from — logits after repetition penalty, `min_tokens` EOS
suppression, temperature and top-k / top-p truncation, renormalised. This is vLLM's
`processed_logprobs` mode. With temperature 1 and no truncation it is the model's plain
log-softmax; greedy requests (temperature 0) report the log-softmax at temperature 1.

One request's extreme parameters must not cost the others their step: a row whose distribution
is not a distribution (NaN or +inf after processing, every token removed) is sampled from a
stand-in and reported in `SampleResult.failed`, for the engine to abort that sequence alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False  # vLLM's name: the text keeps the stop it ended at
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    logprobs: int | None = None  # number of top logprobs per token (0 = only the sampled one)
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def stopped_text(self, text: str) -> tuple[str, str] | None:
        """(the text a stopped completion returns, the stop string that ended it) where a stop
        string occurs in `text` (the earliest one, as vLLM matching token by token finds it);
        else None. The stop is cut off unless `include_stop_str_in_output`."""
        found = [(position, stop) for stop in self.stop if (position := text.find(stop)) != -1]
        if not found:
            return None
        position, stop = min(found)
        end = position + len(stop) if self.include_stop_str_in_output else position
        return text[:end], stop


@dataclass
class SequenceView:
    """What sampling needs to know about one running sequence."""

    params: SamplingParams
    token_history: torch.Tensor  # [prompt + generated] long, for the repetition penalty
    num_generated: int
    generator: torch.Generator | None


def process_logits(
    logits: torch.Tensor, sequences: list[SequenceView], eos_token_ids: list[int]
) -> torch.Tensor:
    """[batch, vocab] float32 logits of the distributions to sample from (see module doc)."""
    edits = any(
        s.params.repetition_penalty != 1.0 or s.num_generated < s.params.min_tokens
        for s in sequences
    )
    logits = logits.float().clone() if edits else logits.float()  # edited in place below
    for row, sequence in enumerate(sequences):
        params = sequence.params
        if params.repetition_penalty != 1.0:
            seen = torch.unique(sequence.token_history)
            values = logits[row, seen]
            logits[row, seen] = torch.where(
                values > 0, values / params.repetition_penalty, values * params.repetition_penalty
            )
        if sequence.num_generated < params.min_tokens:
            vocab = logits.shape[-1]  # a stop id beyond the vocabulary can never be sampled
            banned = [t for t in [*eos_token_ids, *params.stop_token_ids] if 0 <= t < vocab]
            logits[row, banned] = float("-inf")
    temperatures = torch.tensor(
        [s.params.temperature if not s.params.greedy else 1.0 for s in sequences],
        device=logits.device,
    ).unsqueeze(1)
    logits = logits / temperatures
    if any(_truncates(s.params) for s in sequences):
        logits = _truncate(logits, sequences)
    return logits


def _truncates(params: SamplingParams) -> bool:
    return params.top_k > 0 or params.top_p < 1.0


def _truncate(logits: torch.Tensor, sequences: list[SequenceView]) -> torch.Tensor:
    """Top-k then top-p (nucleus) per row; removed tokens get -inf."""
    vocab = logits.shape[-1]
    device = logits.device
    top_k = torch.tensor(
        [min(s.params.top_k, vocab) if s.params.top_k > 0 else vocab for s in sequences],
        device=device,
    )
    top_p = torch.tensor([s.params.top_p for s in sequences], device=device).unsqueeze(1)
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device).unsqueeze(0)
    remove = ranks >= top_k.unsqueeze(1)
    probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # probability of strictly better tokens
    remove |= mass_before >= top_p
    remove[:, 0] = False  # always keep the most likely token
    return logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))


@dataclass(frozen=True)
class SampleResult:
    tokens: torch.Tensor  # [batch] long
    logprobs: torch.Tensor  # [batch] float32: logprob of each sampled token
    top_ids: torch.Tensor | None = None  # [batch, k] long, when a sequence asked for top logprobs
    top_logprobs: torch.Tensor | None = None  # [batch, k] float32
    failed: list[int] = field(default_factory=list)  # rows without a valid distribution


# Columns per block of the two-level draw: a row's cumulative sum runs over its block sums and
# then over one block, not over the whole vocabulary (3.0 of 3.1 ms of a 64 × 49,152 draw).
CDF_BLOCK = 1024


def inverse_cdf(
    weights: torch.Tensor, uniform: torch.Tensor, block: int = CDF_BLOCK
) -> torch.Tensor:
    """One token per row drawn in proportion to `weights` [rows, vocab] (unnormalised
    probabilities, finite, not all 0) by inverting their cumulative sum at `uniform` [rows] in
    [0, 1): an exact categorical draw, 20x cheaper on a CPU than `torch.multinomial` at a 49k
    vocabulary. In two levels: the block (`block` columns) whose cumulative mass passes the
    target, then the token inside it, so the full-width cumulative sum is never written. The
    strict `right=True` search never picks a token of weight 0 (its interval is empty); a target
    that float rounding puts past the total, or past its block's own sum, takes the last block
    with mass, and in a block its last token of weight > 0."""
    rows, vocab = weights.shape
    blocks = -(-vocab // block)
    padded = weights if blocks * block == vocab else torch.nn.functional.pad(
        weights, (0, blocks * block - vocab)
    )  # fmt: skip
    columns = padded.view(rows, blocks, block)
    # summed up in float64: a GPU's parallel cumsum of float32 block sums need not rise
    # monotonically by a rounding, which could pick a block without mass (a few hundred columns)
    block_mass = columns.sum(dim=-1).double().cumsum(dim=-1)  # [rows, blocks]
    total = block_mass[:, -1:].contiguous()
    targets = uniform.unsqueeze(1) * total
    # a target rounded up to the total would land past the last block with any mass
    last_block = torch.searchsorted(block_mass, total)
    chosen = torch.minimum(torch.searchsorted(block_mass, targets, right=True), last_block)
    before = torch.where(
        chosen > 0, block_mass.gather(1, (chosen - 1).clamp_(min=0)), block_mass.new_zeros(())
    )
    inside = columns[torch.arange(rows, device=weights.device), chosen.squeeze(1)]
    remainder = (targets - before).to(inside.dtype)
    within = torch.searchsorted(inside.cumsum(dim=-1), remainder, right=True)
    positions = torch.arange(block, device=weights.device)
    last_weighted = torch.where(inside > 0, positions, -1).amax(dim=-1, keepdim=True)
    return (chosen * block + torch.minimum(within, last_weighted)).squeeze(1)


def sample(
    logits: torch.Tensor, sequences: list[SequenceView], eos_token_ids: list[int]
) -> SampleResult:
    """Sample one token per row from `process_logits`; seeded rows use their own generator."""
    processed = process_logits(logits, sequences, eos_token_ids)
    # a row's largest logit is not finite exactly when the row holds a NaN or +inf or nothing
    # but -inf: a row without a distribution (`amax`, not `max`: 0.2 against 2.7 ms for
    # 64 × 49,152, which also finds the indices)
    row_max = processed.amax(dim=-1)
    broken = ~torch.isfinite(row_max)
    failed = broken.nonzero().flatten().tolist()
    if failed:  # a uniform stand-in keeps the batch going; the engine aborts these rows
        processed[broken] = 0.0
        row_max = row_max.masked_fill(broken, 0.0)
    # in place: `processed` is the sampler's own (`process_logits` divides into a new tensor);
    # one [batch, vocab] tensor fewer a pass (~4 ms of SmolLM2's 185 at 40 rows in a profile)
    shifted = processed.sub_(row_max.unsqueeze(1))  # [batch, vocab], at most 0
    weights = shifted.exp()  # the distribution, unnormalised
    log_total = weights.sum(dim=-1).log()  # [batch]: log_softmax = shifted - log_total
    greedy_rows = [row for row, s in enumerate(sequences) if s.params.greedy]
    if len(greedy_rows) == len(sequences):
        tokens = shifted.argmax(dim=-1)
    else:
        uniform = torch.rand(len(sequences), device=logits.device)
        for row, sequence in enumerate(sequences):
            if sequence.generator is not None and not sequence.params.greedy:
                uniform[row] = torch.rand(1, generator=sequence.generator, device=logits.device)[0]
        tokens = inverse_cdf(weights, uniform)
        if greedy_rows:
            rows = torch.tensor(greedy_rows, device=logits.device)
            tokens[rows] = shifted[rows].argmax(dim=-1)
    chosen = torch.gather(shifted, 1, tokens.unsqueeze(1)).squeeze(1) - log_total
    wanted = max((s.params.logprobs or 0) for s in sequences)
    if wanted > 0:
        logprobs_all = shifted - log_total.unsqueeze(1)  # [batch, vocab]
        top_logprobs, top_ids = torch.topk(logprobs_all, min(wanted, logprobs_all.shape[-1]))
        return SampleResult(tokens, chosen, top_ids, top_logprobs, failed)
    return SampleResult(tokens, chosen, None, None, failed)


def sample_rows_apart(
    logits: torch.Tensor, sequences: list[SequenceView], eos_token_ids: list[int]
) -> SampleResult:
    """`sample` row by row, for a batch whose `sample` raised: a row that raises again is
    reported in `failed` (with a stand-in token), so only the rows that raise lose their
    sequence. Results on the CPU, where the engine reads them."""
    rows: list[SampleResult] = []
    failed: list[int] = []
    for row, sequence in enumerate(sequences):
        try:
            rows.append(sample(logits[row : row + 1], [sequence], eos_token_ids))
        except Exception:
            failed.append(row)
            rows.append(SampleResult(torch.zeros(1, dtype=torch.long), torch.zeros(1)))
    width = max((r.top_ids.shape[1] for r in rows if r.top_ids is not None), default=0)
    return SampleResult(
        torch.cat([r.tokens.cpu() for r in rows]),
        torch.cat([r.logprobs.cpu() for r in rows]),
        torch.cat([_top(r.top_ids, width, 0, torch.long) for r in rows]) if width else None,
        torch.cat([_top(r.top_logprobs, width, -math.inf, torch.float32) for r in rows])
        if width
        else None,
        sorted(failed + [row for row, r in enumerate(rows) if r.failed]),
    )


def _top(values: torch.Tensor | None, width: int, fill: float, dtype: torch.dtype) -> torch.Tensor:
    """One row of top ids / logprobs padded to `width` columns (rows may ask for fewer)."""
    if values is None:
        return torch.full((1, width), fill, dtype=dtype)
    values = values.cpu()
    missing = width - values.shape[1]
    return torch.nn.functional.pad(values, (0, missing), value=fill) if missing else values
