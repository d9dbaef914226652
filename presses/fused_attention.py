"""A prefill's attention output and its column sums in one chunked pass.

A press that scores by column sums of attention while the model runs sdpa computes every query-key product
twice: once inside sdpa, once for the sums (``presses.attention.attention_rows``). On a CPU that
second pass costs about as much as the attention itself (README, Benchmarks). ``fused_sdpa``, registered in
transformers' ``AttentionInterface``, computes the layer's output from the very probabilities it sums, so
scoring adds only the sums. Its output equals sdpa's within float rounding, not bit for bit, which is why a
press uses it only when asked (``RMMPress(fused_attention=True)``).

A press asks by attaching a ``ColumnSumRequest`` to each attention module (``fused_column_sums``); after the
layer's prefill the module holds the sums, which the press takes in its forward hook
(``presses.column_sums.provided``). Whatever ``fused_sdpa`` cannot sum exactly (a padding mask, a sliding
window, a single query row) it hands to sdpa unchanged, providing no sums, and the press recomputes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask
from transformers.models.llama.modeling_llama import repeat_kv

from presses.attention import attention_implementation, probability_chunks
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
    """Causal attention chunk by chunk, summing each chunk's probabilities into the module's request.

    ``query``: (batch, num_heads, q_len, head_dim), the last q_len positions of ``key`` and ``value``
    (batch, num_kv_heads, k_len, head_dim). Returns (batch, q_len, num_heads, head_dim), as transformers'
    sdpa integration does.
    """
    request: ColumnSumRequest | None = getattr(module, REQUEST, None)
    q_len, k_len = query.shape[2], key.shape[2]
    fusable = (
        request is not None
        and q_len > 1
        and attention_mask is None
        and not dropout
        and kwargs.get("sliding_window") is None
        and getattr(module, "is_causal", True)
        and (request.weights is None or request.weights.shape[-1] == k_len)
    )
    if request is not None:
        getattr(module, PROVIDED, {}).pop(request.statistic, None)
    if not fusable:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    values = repeat_kv(value, query.shape[1] // value.shape[1])
    weights = None if request.weights is None else request.weights.to(query.device).float()
    sums = torch.zeros(query.shape[0], query.shape[1], k_len, dtype=torch.float32, device=query.device)
    output = torch.empty_like(query)
    for first, probs in probability_chunks(query * scale, key, request.chunk_size):
        stop, visible = first + probs.shape[2], probs.shape[-1]
        output[:, :, first:stop] = torch.matmul(probs.to(query.dtype), values[:, :, :visible])
        rows = torch.arange(k_len - q_len + first, k_len - q_len + stop, device=query.device)
        add_column_sums(sums, probs, rows, request.statistic.lag, None if weights is None else weights[:, rows])
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
    if model.config._attn_implementation != "sdpa":
        yield
        return
    attentions = [layer.self_attn for layer in layers]
    for attention in attentions:
        setattr(attention, REQUEST, ColumnSumRequest(statistic, weights, chunk_size))
    try:
        with attention_implementation(model, FUSED_SDPA):
            yield
    finally:
        for attention in attentions:
            delattr(attention, REQUEST)
            if hasattr(attention, PROVIDED):
                delattr(attention, PROVIDED)
