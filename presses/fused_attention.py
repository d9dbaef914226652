"""A prefill's attention output and its column sums in one chunked pass.

A press that scores by column sums of attention while the model runs sdpa computes every query-key product
twice: once inside sdpa, once for the sums (``presses.attention.attention_rows``). On a CPU that
second pass costs about as much as the attention itself (README, Benchmarks). ``fused_sdpa``, registered in
transformers' ``AttentionInterface``, computes the layer's output from the very probabilities it sums, so
scoring adds only the sums. Its output equals sdpa's within float rounding, not bit for bit, which is why a
press uses it only when asked (``RMMPress(fused_attention=True)``).

A press asks by attaching a ``ColumnSumRequest`` to each attention module (``fused_column_sums``); after the
layer's prefill the module holds the sums, which the press takes in its forward hook
(``presses.column_sums.provided``). A caller that weighs rows only once the forward is done (the evaluation
engine's history, by the forward's own predictions) attaches a ``RowsRequest`` instead (``fused_rows``) and gets
the rows' probabilities under the model's mask back. Whatever ``fused_sdpa`` cannot compute exactly (for sums a
padding mask; a sliding window, a single query row) it hands to sdpa unchanged, providing nothing, and the caller
recomputes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from presses.attention import attention_implementation, group_mean, mask_allows, probability_chunks
from presses.column_sums import PROVIDED, ColumnSums, add_column_sums

FUSED_SDPA = "kvet_fused_sdpa"
REQUEST = "kvet_column_sum_request"  # the attribute of an attention module that holds its ColumnSumRequest


@dataclass(frozen=True)
class ColumnSumRequest:
    """The column sums a press wants from a layer's prefill: ``statistic`` with ``weights`` per cached position,
    the weight of the query row at that position, (batch, length), or None for all ones."""

    statistic: ColumnSums
    weights: torch.Tensor | None
    chunk_size: int


@dataclass
class RowsRequest:
    """Every query row's attention probabilities (float32, averaged over each KV group's query heads, as
    ``probability_chunks`` yields them): ``chunks`` of (first row, (batch, num_kv_heads, chunk, visible)).
    ``unpadded``: the caller's sequences have no padding, so the model's mask is causal and is not read."""

    chunk_size: int
    unpadded: bool = False
    chunks: list[tuple[int, torch.Tensor]] = field(default_factory=list)


def fused_sdpa(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal attention chunk by chunk, handing each chunk's probabilities to the module's request: summed
    (``ColumnSumRequest``) or kept (``RowsRequest``).

    ``query``: (batch, num_heads, q_len, head_dim), the last q_len positions of ``key`` and ``value``
    (batch, num_kv_heads, k_len, head_dim). Returns (batch, q_len, num_heads, head_dim), as transformers'
    sdpa integration does.
    """
    request: ColumnSumRequest | RowsRequest | None = getattr(module, REQUEST, None)
    sums_of = isinstance(request, ColumnSumRequest)
    q_len, k_len = query.shape[2], key.shape[2]
    fusable = (
        request is not None
        and q_len > 1
        and (attention_mask is None or not sums_of)
        and not dropout
        and kwargs.get("sliding_window") is None
        and getattr(module, "is_causal", True)
        and (not sums_of or request.weights is None or request.weights.shape[-1] == k_len)
    )
    if sums_of:
        getattr(module, PROVIDED, {}).pop(request.statistic, None)
    if not fusable:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    batch, heads, kv_heads = query.shape[0], query.shape[1], key.shape[1]
    weights = None if not sums_of or request.weights is None else request.weights.to(query.device).float()
    sums = torch.zeros(batch, heads, k_len, dtype=torch.float32, device=query.device) if sums_of else None
    unpadded = attention_mask is None or (not sums_of and request.unpadded)
    allowed = None if unpadded else mask_allows(attention_mask, k_len)
    output = torch.empty_like(query)
    for first, probs in probability_chunks(query.float() * scale, key, request.chunk_size, allowed):
        stop, visible = first + probs.shape[2], probs.shape[-1]
        grouped = probs.to(query.dtype).view(batch, kv_heads, -1, visible)  # each KV head meets its query group
        output[:, :, first:stop] = torch.matmul(grouped, value[:, :, :visible]).view(batch, heads, stop - first, -1)
        if sums_of:
            rows = torch.arange(k_len - q_len + first, k_len - q_len + stop, device=query.device)
            add_column_sums(sums, probs, rows, request.statistic.lag, None if weights is None else weights[:, rows])
        else:
            request.chunks.append((first, group_mean(probs, kv_heads)))
    if sums_of:
        setattr(module, PROVIDED, {**getattr(module, PROVIDED, {}), request.statistic: sums})
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(FUSED_SDPA, fused_sdpa)
AttentionMaskInterface.register(FUSED_SDPA, sdpa_mask)  # padding reaches fused_sdpa, which then defers to sdpa


@contextmanager
def fused_column_sums(
    model: PreTrainedModel,
    layers: nn.ModuleList,
    statistic: ColumnSums,
    weights: torch.Tensor | None,
    chunk_size: int,
) -> Iterator[None]:
    """Inside the block, ``model`` runs ``fused_sdpa`` and the attention module of each of ``layers`` carries a
    ``ColumnSumRequest``. Only a model running sdpa is switched: eager attention already hands out its weights,
    and other kernels are left alone (the press then recomputes the sums)."""
    with _requesting(model, layers, [ColumnSumRequest(statistic, weights, chunk_size) for _ in layers]):
        yield


@contextmanager
def fused_rows(
    model: PreTrainedModel, layers: nn.ModuleList, chunk_size: int, unpadded: bool
) -> Iterator[list[RowsRequest] | None]:
    """Inside the block, ``model`` runs ``fused_sdpa`` and each of ``layers`` keeps its rows in the yielded
    ``RowsRequest`` (None where the model does not run sdpa: nothing is switched, the caller recomputes)."""
    requests = [RowsRequest(chunk_size, unpadded) for _ in layers]
    with _requesting(model, layers, requests) as switched:
        yield requests if switched else None


@contextmanager
def _requesting(model: PreTrainedModel, layers: nn.ModuleList, requests: list) -> Iterator[bool]:
    """Each layer's attention module carries its request while ``model`` runs ``fused_sdpa``, if it ran sdpa."""
    if model.config._attn_implementation != "sdpa":
        yield False
        return
    attentions = [layer.self_attn for layer in layers]
    for attention, request in zip(attentions, requests, strict=True):
        setattr(attention, REQUEST, request)
    try:
        with attention_implementation(model, FUSED_SDPA):
            yield True
    finally:
        for attention in attentions:
            delattr(attention, REQUEST)
            if hasattr(attention, PROVIDED):
                delattr(attention, PROVIDED)
