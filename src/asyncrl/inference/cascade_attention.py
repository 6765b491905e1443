"""Decode attention that reads a group's shared prompt once (cascade attention).

GRPO asks for n samples of each prompt, so most rows of a decode pass are siblings whose keys
and values for the prompt are copies of one prefill (`Engine._forward` copies the leader's
slot). Plain attention reads those copies once per row: 8 × 8 × 128 on SmolLM2 reads 50 prompt
positions of every row against 64 of its own on average, and attention was 21 % of a pass.
Here each decode pass attends in two parts and merges them exactly:

- **prefix**: for each group of rows holding the same prompt keys, all of the group's queries
  against the prompt's keys of one member's slot, read once ([groups, kv_heads, rows × query
  heads per kv head, head_dim] — a wider product than one row's);
- **suffix**: every row against its own keys after the prompt, up to its current token;

and the two softmaxes are combined by their log-sum-exps: out = o₁·e^(lse₁−lse) + o₂·e^(lse₂−lse)
with lse = log(e^lse₁ + e^lse₂), the attention over the union (FlashInfer's and vLLM's cascade
merge). Both parts run the CPU flash-attention kernel SDPA itself uses, which returns the
log-sum-exp. Every row still attends to exactly its own keys: a sibling's prompt keys are bit for
bit its own (copies), so only the order of the float sums differs from one SDPA call.

Where it cannot hold the rows go through plain SDPA, as before: a prefill, a pass whose keys
would reach past a sliding window, a float type other than float32 (the merge in float32 of a
bf16 product would round differently from SDPA's), a device other than the CPU, a model whose
attention needs what SDPA alone gives (soft-capping, sinks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from asyncrl.log import get_logger
from asyncrl.models.attention_layers import sliding_window

logger = get_logger(__name__)

NAME = "asyncrl_cascade"
PLAN_ARGUMENT = "asyncrl_cascade_plan"  # how a pass's plan reaches the attention of each layer


@dataclass(frozen=True)
class CascadePlan:
    """One decode pass's rows, grouped by the prompt keys they hold; built by `plan_cascade`."""

    layers: frozenset[int]  # layer indices that attend this way (others: SDPA, keys gathered)
    group_rows: slice | torch.Tensor  # [groups × widest] each group's rows (a short one repeats)
    widest: int  # rows of the largest group
    group_slots: slice | torch.Tensor  # [groups] the slot whose prompt keys a group reads
    prefix_len: int  # the longest prompt of the pass
    prefix_mask: torch.Tensor  # [groups, 1, 1, prefix_len] 0 where a group's prompt has a key
    row_in_groups: slice | torch.Tensor  # [rows] each row's place in `group_rows`
    slots: torch.Tensor | slice  # the rows' slots (a slice when consecutive: no gather)
    suffix_start: int  # the shortest prompt: where every row's own keys begin
    suffix_mask: torch.Tensor  # [rows, 1, 1, kv_len - suffix_start] 0 on a row's own keys
    # layers that attended this way, appended as they do: for `all_attended`
    attended: list[int] = field(default_factory=list)

    def all_attended(self) -> bool:
        """Whether every layer of the plan attended through `cascade_attention`: for those the
        cache handed the model its whole keys and values, right only for this function (a model
        that does not pass its keyword arguments on to its attention, or that picks its own
        kernel, would have attended over every slot)."""
        return sorted(self.attended) == sorted(self.layers)


class PlanIgnored(RuntimeError):
    """A forward pass in which a planned layer did not attend through `cascade_attention`."""


@contextlib.contextmanager
def attending_by(plan: CascadePlan | None, model_type: str) -> Iterator[None]:
    """Around a forward pass given `plan`: where a planned layer did not attend through
    `cascade_attention` (a model that does not hand its keyword arguments on to its attention,
    or picks its own kernel) it saw every slot's keys, so the pass raises `PlanIgnored` (from
    the error, where the wrong shapes already raised one) and its tokens are never used."""
    try:
        yield
    except Exception as error:
        if plan is not None and not plan.all_attended():
            raise _ignored(plan, model_type) from error
        raise
    if plan is not None and not plan.all_attended():
        raise _ignored(plan, model_type)


def _ignored(plan: CascadePlan, model_type: str) -> PlanIgnored:
    missing = sorted(plan.layers - set(plan.attended))
    message = (
        f"cascade attention: {model_type}'s layers {missing} did not attend through it (they "
        "saw every slot's keys); this pass's requests are aborted and cascade is off from now on"
    )
    logger.error(message)
    return PlanIgnored(message)


def cascade_layers(config: Any, num_layers: int, reach: int) -> frozenset[int]:
    """The layers a decode pass whose longest row holds `reach` keys may attend this way: all,
    but a sliding-window layer only while no row's keys reach past its window (it would have to
    drop the oldest, prompt keys first)."""
    window = sliding_window(config)
    kinds = getattr(config, "layer_types", None) or ["sliding_attention"] * num_layers
    return frozenset(
        index for index, kind in enumerate(kinds)
        if window is None or kind != "sliding_attention" or reach <= window
    )  # fmt: skip


def plan_cascade(
    slots: list[int],
    positions: list[int],
    prompt_lens: list[int],
    prompt_keys: list[int],
    config: Any,
    device: torch.device,
) -> CascadePlan | None:
    """The plan of a decode pass whose row i writes its token at `positions[i]` of
    `slots[i]`, with `prompt_lens[i]` leading keys equal in every row of the same
    `prompt_keys[i]`, for a model of `config`. None where no group has two rows (nothing would
    be read less) or no layer may attend this way."""
    layers = cascade_layers(config, config.num_hidden_layers, max(positions) + 1)
    groups: dict[int, list[int]] = {}
    for row, key in enumerate(prompt_keys):
        groups.setdefault(key, []).append(row)
    if len(groups) == len(slots) or min(prompt_lens) < 1 or not layers:
        return None
    members = list(groups.values())
    widest = max(len(rows) for rows in members)
    row_in_groups = [0] * len(slots)
    for index, rows in enumerate(members):
        for place, row in enumerate(rows):
            row_in_groups[row] = index * widest + place
    prefix_len, suffix_start = max(prompt_lens), min(prompt_lens)
    kv_len = max(positions) + 1
    group_lens = torch.tensor([prompt_lens[rows[0]] for rows in members], device=device)
    key_at = torch.arange(prefix_len, device=device)
    prefix_mask = _additive(key_at.view(1, -1) < group_lens.view(-1, 1))
    own_at = torch.arange(suffix_start, kv_len, device=device).view(1, -1)
    starts = torch.tensor(prompt_lens, device=device).view(-1, 1)
    ends = torch.tensor(positions, device=device).view(-1, 1)
    suffix_mask = _additive((own_at >= starts) & (own_at <= ends))
    group_rows = [row for rows in members for row in rows + [rows[0]] * (widest - len(rows))]
    return CascadePlan(
        layers=layers,
        group_rows=_index(group_rows, device),
        widest=widest,
        group_slots=_index([slots[rows[0]] for rows in members], device),
        prefix_len=prefix_len,
        prefix_mask=prefix_mask.view(len(members), 1, 1, prefix_len),
        row_in_groups=_index(row_in_groups, device),
        slots=_index(slots, device),
        suffix_start=suffix_start,
        suffix_mask=suffix_mask.view(len(slots), 1, 1, kv_len - suffix_start),
    )


def _index(values: list[int], device: torch.device) -> slice | torch.Tensor:
    """`values` as an index: a slice where they step evenly upwards (a view of what they index,
    nothing copied; the common case, since a pass runs in slot order and a group's rows are
    consecutive), else a tensor (a gather)."""
    first, count = values[0], len(values)
    step = values[1] - first if count > 1 else 1
    if step > 0 and values == list(range(first, first + step * count, step)):
        return slice(first, first + step * (count - 1) + 1, step)
    return torch.tensor(values, device=device)


def _additive(visible: torch.Tensor) -> torch.Tensor:
    return torch.zeros(visible.shape, device=visible.device).masked_fill_(~visible, -torch.inf)


def cascade_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature. With a plan for this layer, `key` and `value` are the
    layer's whole cache ([slots, kv_heads, max_len, head_dim], `SlotKVCache.update`), the new
    token's already written; without one, exactly SDPA."""
    plan: CascadePlan | None = kwargs.pop(PLAN_ARGUMENT, None)
    if plan is None or module.layer_idx not in plan.layers:  # type: ignore[operator]
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, **kwargs
        )
    if kwargs.get("s_aux") is not None or kwargs.get("softcap") is not None:
        raise NotImplementedError(f"{NAME}: attention sinks and soft-capping are SDPA's alone")
    plan.attended.append(module.layer_idx)  # type: ignore[arg-type]
    rows, heads, _, head_dim = query.shape
    kv_heads = key.shape[1]
    per_kv = heads // kv_heads
    scale = scaling if scaling is not None else head_dim**-0.5
    # a query head h reads kv head h // per_kv: a row's queries as [kv_heads, per_kv]
    queries = query.reshape(rows, kv_heads, per_kv, head_dim)
    widest = plan.widest
    groups = plan.prefix_mask.shape[0]
    grouped = (
        queries[plan.group_rows]
        .view(groups, widest, kv_heads, per_kv, head_dim)
        .transpose(1, 2)
        .reshape(groups, kv_heads, widest * per_kv, head_dim)
    )
    prefix = slice(0, plan.prefix_len)
    out_1, lse_1 = _attend(grouped, key, value, plan.group_slots, prefix, plan.prefix_mask, scale)
    # back to rows: [groups, kv_heads, widest, per_kv] -> [groups * widest, kv_heads, per_kv]
    out_1 = out_1.reshape(groups, kv_heads, widest, per_kv, head_dim).transpose(1, 2)
    out_1 = out_1.reshape(groups * widest, kv_heads, per_kv, head_dim)[plan.row_in_groups]
    lse_1 = lse_1.reshape(groups, kv_heads, widest, per_kv).transpose(1, 2)
    lse_1 = lse_1.reshape(groups * widest, kv_heads, per_kv)[plan.row_in_groups]
    own = slice(plan.suffix_start, plan.suffix_start + plan.suffix_mask.shape[-1])
    out_2, lse_2 = _attend(queries, key, value, plan.slots, own, plan.suffix_mask, scale)
    lse = torch.logaddexp(lse_1, lse_2).unsqueeze(-1)
    merged = out_1 * torch.exp(lse_1.unsqueeze(-1) - lse) + out_2 * torch.exp(
        lse_2.unsqueeze(-1) - lse
    )
    return merged.reshape(rows, 1, heads, head_dim), None


def _attend(
    queries: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slots: slice | torch.Tensor,
    positions: slice,
    mask: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention, log-sum-exp) of `queries` over the keys at `positions` of `slots`: the CPU
    flash kernel SDPA runs, called directly for the log-sum-exp it computes anyway."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        queries, key[slots, :, positions], value[slots, :, positions], attn_mask=mask, scale=scale
    )


def use_cascade_attention(model: torch.nn.Module) -> bool:
    """Let `model` attend through `cascade_attention` (SDPA wherever a pass brings no plan);
    returns whether it does: only a CPU float32 model that attends with SDPA now and has no
    attention sinks (gpt-oss) or soft-capping (Gemma 2), which only SDPA's own path applies."""
    parameter = next(model.parameters())
    config = model.config
    if (
        parameter.device.type != "cpu"
        or parameter.dtype != torch.float32
        or getattr(config, "_attn_implementation", None) != "sdpa"
        or getattr(config, "attn_logit_softcapping", None) is not None
        or any(hasattr(module, "sinks") for module in model.modules())
    ):
        return False
    AttentionInterface.register(NAME, cascade_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    config._attn_implementation = NAME
    text_config = getattr(config, "text_config", None)  # a multimodal model's language part
    if text_config is not None:
        text_config._attn_implementation = NAME
    return True
