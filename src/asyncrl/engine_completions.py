"""Held-out completions from the embedded engine, in this process: `asyncrl eval`'s fast path.

`model.generate` (evaluate.py) pads a batch to its longest prompt, prefills every sample's copy
of its prompt, runs until the batch's longest answer ends and draws each step over rows that
have finished. The embedded engine (`inference/engine.py`, what `asyncrl rl` serves) prefills an
example's prompt once for its k samples, drops a row the moment it ends and runs every row of
the whole eval in one continuous batch; on SmolLM2 that made it 1.5–1.9× one batched `generate`
per core (benchmarks/RESULTS.md). Both draw from the same distribution, `softmax(logits / T)`
over the whole vocabulary (no top-k or top-p), so the expected reward is the same; the draws
themselves differ, and the per-token logprobs the engine serves are tested against a plain
forward pass (tests/contract/).

Each example's k samples are one request with n = k; row j of the whole eval (its examples'
samples in order) draws from a generator of its own seeded `seed + j`, so a score does not
depend on how many rows ran beside it and no two rows share a stream. Completions are decoded
without special tokens and cut at the example's stop strings, as `generate_completions` does.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from asyncrl.envs import Example
from asyncrl.envs.plain_prompt import cut_at_stop
from asyncrl.inference.engine import Engine
from asyncrl.inference.kv_cache import default_budget, slot_bytes
from asyncrl.inference.sampling import SamplingParams

MAX_ROWS = 256  # the server's own default `max_num_seqs`


def prompt_ids(example: Example, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokens the server would prefill: a base model's plain prompt with the tokenizer's
    special tokens (Gemma's <bos>), else the chat template's rendering with its generation
    prompt."""
    if example.prompt_text is not None:
        return list(tokenizer(example.prompt_text, add_special_tokens=True)["input_ids"])
    rendered = tokenizer.apply_chat_template(
        example.prompt, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    return list(rendered)


def grouped(examples: list[Example]) -> list[tuple[Example, int]]:
    """Runs of the same example (the eval lists each one k times in a row) as (example, k)."""
    runs: list[tuple[Example, int]] = []
    for example in examples:
        if runs and runs[-1][0] is example:
            runs[-1] = (example, runs[-1][1] + 1)
        else:
            runs.append((example, 1))
    return runs


def rows_that_fit(model: torch.nn.Module, rows: int, max_len: int) -> int:
    """As many slots as rows, at most `MAX_ROWS` and what the KV cache budget holds."""
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    per_slot = slot_bytes(model.config, max_len, dtype)
    return max(1, min(rows, MAX_ROWS, default_budget(device) // per_slot))


@torch.no_grad()
def engine_completions(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    examples: list[Example],
    *,
    max_tokens: int,
    temperature: float,
    seed: int,
) -> list[str]:
    """One completion per entry of `examples`, in order; greedy when temperature is 0."""
    runs = grouped(examples)
    prompts = [prompt_ids(example, tokenizer) for example, _ in runs]
    max_len = max(len(ids) for ids in prompts) + max_tokens
    engine = Engine(
        model,
        tokenizer,
        max_num_seqs=rows_that_fit(model, len(examples), max_len),
        max_model_len=max_len,
    )
    try:
        requests, first_row = [], 0
        for (example, k), ids in zip(runs, prompts, strict=True):
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=temperature,
                stop=list(example.stop),
                include_stop_str_in_output=example.stop_kept,
                seed=None if temperature == 0 else seed + first_row,  # + i for its sample i
            )
            requests.append(engine.submit(ids, params, n=k))
            first_row += k
        completions: list[str] = []
        for (example, _), request in zip(runs, requests, strict=True):
            for output in sorted(request.done.result(), key=lambda o: o.index):
                if output.finish_reason == "abort":
                    raise RuntimeError(
                        f"eval: the engine aborted a completion of example {example.example_id}"
                        f" ({engine.failure or 'no reason given'})"
                    )
                text = tokenizer.decode(output.token_ids, skip_special_tokens=True)
                completions.append(cut_at_stop(text, example.stop, kept=example.stop_kept))
        return completions
    finally:
        engine.shutdown()
