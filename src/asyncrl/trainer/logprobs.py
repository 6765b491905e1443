"""Per-token logprobs of the tokens actually in a (packed) sequence under the current model."""

from __future__ import annotations

import torch

from asyncrl.trainer.packing import PackedBatch


def token_logprobs(
    model: torch.nn.Module, batch: PackedBatch, temperature: float = 1.0
) -> torch.Tensor:
    """[rows, seq_len] float32: entry t is log p(token t | tokens < t of its sample).

    Entry 0 of each row, and the first token of every packed sample, has no prediction inside
    its sample; those positions are never loss targets (they are prompt tokens) and hold
    whatever the previous sample's last position predicts. Logits are divided by `temperature`
    before the softmax, as the inference engine does when it samples.
    """
    logits = model(
        input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False
    ).logits  # [rows, seq_len, vocab]
    logits = logits[:, :-1].float() / temperature
    targets = batch.input_ids[:, 1:].unsqueeze(-1)  # [rows, seq_len - 1, 1]
    picked = torch.gather(logits, -1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return torch.nn.functional.pad(picked, (1, 0))
