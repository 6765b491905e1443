"""Per-token logprobs (and entropy) of the trained tokens of a packed micro-batch.

The decoder runs once over the packed rows; the LM head then runs over the hidden states of the
positions that predict a loss token only, in chunks of `chunk_size` tokens, each chunk under
activation checkpointing when there are several. So the `[tokens × vocab]` logits never exist at
once, neither in the forward pass nor among the tensors autograd keeps for the backward pass (it
recomputes one chunk's logits at a time). Logits are divided by each token's sampling
temperature before the softmax, as the inference engine did when it sampled; the softmax, the
picked token's log-probability and the entropy take a few passes over a chunk's logits, not
autograd's ~20 (`token_softmax.py`).

Logits are lm_head(final hidden state), soft-capped where the model's config says so
(`final_logit_softcapping`: Gemma 2; None in Gemma 3), as the model's own forward does. A
shared-prefix row's ready mask is given per layer type (`models/attention_layers.py`), so a
sliding-window layer (Gemma 3) sees no further back than the server's did.

Under FSDP2 the decoder and head are called without the root's `forward`, so the computation is
registered as an FSDP forward method of the root (`register_fsdp_logprobs`): FSDP then gathers
the root's own parameters (embeddings, final norm, head) around it and hooks its outputs for
the backward pass, as it would for `forward`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.fsdp import register_fsdp_forward_method
from torch.utils.checkpoint import checkpoint

from asyncrl.models.attention_layers import layer_masks
from asyncrl.trainer.packing import PackedBatch
from asyncrl.trainer.token_softmax import token_logprob_entropy


@dataclass(frozen=True)
class TokenLogprobs:
    logprobs: torch.Tensor  # [T] float32, with grad: log p(token | its prefix) at temperature
    # [T] float32: entropy of the same distribution; detached unless asked for with its
    # gradient (`entropy_grad`, for the loss's entropy term)
    entropy: torch.Tensor


@dataclass(frozen=True)
class _Request:
    """The method's one argument. A dataclass on purpose: FSDP casts the floating tensors it
    finds in a forward's arguments to the compute dtype, and the temperatures must stay exact."""

    batch: PackedBatch
    temperature: torch.Tensor | float
    chunk_size: int | None
    entropy_grad: bool = False


FSDP_METHOD = "asyncrl_token_logprobs"


def register_fsdp_logprobs(model: torch.nn.Module) -> None:
    """Make `completion_logprobs(model, …)` an FSDP forward method of `model`, a sharded root."""
    setattr(model, FSDP_METHOD, lambda request: _token_logprobs(model, request))
    register_fsdp_forward_method(model, FSDP_METHOD)


def _decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def _chunk(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor,
    softcap: float | None = None,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden)  # [chunk, vocab]
    if softcap is not None:
        logits = torch.tanh(logits.float() / softcap) * softcap
    return token_logprob_entropy(logits, targets, temperature, entropy_grad)


def completion_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    temperature: torch.Tensor | float = 1.0,
    chunk_size: int | None = 1024,
    entropy_grad: bool = False,
) -> TokenLogprobs:
    """Logprobs of the loss tokens of `batch`, in row-major order.

    `temperature` is a scalar or a [rows, seq_len] tensor (each token's sampling temperature).
    `chunk_size=None` computes all logits at once (the reference path for tests).
    `entropy_grad`: the entropies carry a gradient too (an entropy term in the loss).
    """
    request = _Request(batch, temperature, chunk_size, entropy_grad)
    method = getattr(model, FSDP_METHOD, None)
    logprobs, entropy = method(request) if method is not None else _token_logprobs(model, request)
    return TokenLogprobs(logprobs, entropy)


def _token_logprobs(model: torch.nn.Module, request: _Request) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, entropy), each [T]: a tuple, so FSDP can hook the outputs for backward."""
    batch, temperature, chunk_size = request.batch, request.temperature, request.chunk_size
    if batch.loss_mask[:, 0].any():
        raise ValueError("a row starts with a loss token, which nothing predicts")
    decoder, head = _decoder_and_head(model)
    config = decoder.config
    mask = batch.attention_mask
    if mask is not None:
        mask = layer_masks(config, mask, batch.position_ids, batch.position_ids)
    hidden = decoder(
        input_ids=batch.input_ids, position_ids=batch.position_ids,
        attention_mask=mask, use_cache=False,
    ).last_hidden_state  # [rows, seq_len, hidden]  # fmt: skip
    softcap = getattr(config, "final_logit_softcapping", None)
    if batch.predictor is None:
        targets_mask = batch.loss_mask[:, 1:]  # position t predicts token t + 1
        hidden = hidden[:, :-1][targets_mask]  # [T, hidden]
        targets = batch.input_ids[:, 1:][targets_mask]  # [T]
    else:  # shared prefix: a completion's first token is predicted by the prompt's last
        rows, positions = batch.loss_mask.nonzero(as_tuple=True)  # row-major, as above
        hidden = hidden[rows, batch.predictor[rows, positions]]
        targets = batch.input_ids[rows, positions]
        targets_mask = batch.loss_mask[:, 1:]
    if isinstance(temperature, torch.Tensor):
        temperatures = temperature[:, 1:][targets_mask].float()
    else:
        temperatures = torch.full(targets.shape, float(temperature), device=targets.device)
    if chunk_size is None or targets.shape[0] <= chunk_size:
        # one chunk: recomputing it in the backward pass (checkpointing) would hold no less
        # memory at the peak, where its logits and their gradient coexist either way, and would
        # run the head and the entropy twice (a real vocabulary makes that ~6 % of a step)
        return _chunk(head, hidden, targets, temperatures, softcap, request.entropy_grad)
    pieces = [
        checkpoint(
            _chunk,
            head,
            hidden[start : start + chunk_size],
            targets[start : start + chunk_size],
            temperatures[start : start + chunk_size],
            softcap,
            request.entropy_grad,
            use_reentrant=False,
        )
        for start in range(0, targets.shape[0], chunk_size)
    ]
    if not pieces:
        empty = hidden.new_zeros(0)
        return empty, empty
    return torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])
