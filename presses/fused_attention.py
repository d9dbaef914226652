"""A prefill's attention output and its column sums in one chunked pass.

A press that scores by column sums of attention while the model runs sdpa computes every query-key product
twice: once inside sdpa, once for the sums (``presses.attention.attention_rows``). On a CPU that
second pass costs about as much as the attention itself (README, Benchmarks). ``fused_sdpa`` computes the layer's
output from the very probabilities it sums, so scoring adds only the sums. Its output equals sdpa's within float
rounding, not bit for bit, which is why a press uses it only when asked (``RMMPress(fused_attention=True)``).

Whoever runs a model on ``fused_sdpa`` (``requesting``) registers it in transformers' attention registries then,
never at import, and attaches a ``FusedRequest`` to each attention module: the request takes every chunk of the
forward's probabilities. A press asks for its sums with a ``ColumnSumRequest`` (``fused_column_sums``), which
hands them to the press after the layer's prefill (``ColumnSumReader.hand_column_sums``), before the press's
forward hook reads them. Whatever ``fused_sdpa`` cannot compute exactly (a sliding window, a single query row,
whatever the request declines: a padding mask for sums) it hands to sdpa unchanged, and the caller recomputes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import torch
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from presses.attention import attention_implementation, mask_allows, probability_chunks
from presses.column_sums import ColumnSumReader, add_column_sums

FUSED_SDPA = "kvet_fused_sdpa"
REQUEST = "kvet_fused_request"  # the attribute of an attention module that holds its FusedRequest


class FusedRequest(Protocol):
    """What a caller asks of ``fused_sdpa`` at one attention module: every chunk of ``chunk_size`` query rows'
    probabilities, under the model's mask unless ``unpadded`` (the caller's sequences have no padding, so the mask
    is causal and is not read)."""

    chunk_size: int
    unpadded: bool

    def begin(self, query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
        """A forward of ``query`` (batch, num_heads, q_len, head_dim) over ``key`` (batch, num_kv_heads, k_len,
        head_dim) starts: whether the request takes its chunks (False: sdpa runs it)."""
        ...

    def add(self, first: int, probs: torch.Tensor) -> None:
        """The float32 probabilities (batch, num_heads, chunk, visible) of the forward's rows ``first`` onwards."""
        ...

    def end(self) -> None:
        """Every chunk of the forward has been added."""
        ...


@dataclass
class ColumnSumRequest:
    """The column sums ``reader`` wants from its prefill of the layer ``layer_idx``: its statistic with
    ``weights`` per cached position, the weight of the query row at that position, (batch, length), or None for
    all ones. Handed to the reader after the layer's attention; an earlier forward's sums are taken back when a
    new one starts."""

    reader: ColumnSumReader
    layer_idx: int
    weights: torch.Tensor | None
    chunk_size: int
    unpadded: ClassVar[bool] = False  # a padding mask is declined, so the mask is never read
    _k_len: int = field(default=0, init=False, repr=False)
    _first_row: int = field(default=0, init=False, repr=False)  # the position of the forward's first query row
    _sums: torch.Tensor | None = field(default=None, init=False, repr=False)
    _row_weights: torch.Tensor | None = field(default=None, init=False, repr=False)

    def begin(self, query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
        self.reader.hand_column_sums(self.layer_idx, None)
        self._k_len, self._first_row, self._sums = key.shape[2], key.shape[2] - query.shape[2], None
        return attention_mask is None and (self.weights is None or self.weights.shape[-1] == self._k_len)

    def add(self, first: int, probs: torch.Tensor) -> None:
        if self._sums is None:
            batch, heads = probs.shape[:2]
            self._sums = torch.zeros(batch, heads, self._k_len, dtype=torch.float32, device=probs.device)
            self._row_weights = None if self.weights is None else self.weights.to(probs.device).float()
        rows = torch.arange(self._first_row + first, self._first_row + first + probs.shape[2], device=probs.device)
        weights = None if self._row_weights is None else self._row_weights[:, rows]
        add_column_sums(self._sums, probs, rows, self.reader.statistic.lag, weights)

    def end(self) -> None:
        self.reader.hand_column_sums(self.layer_idx, self._sums)
        self._sums = self._row_weights = None


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
    """Causal attention chunk by chunk, handing each chunk's probabilities to the module's ``FusedRequest``.

    ``query``: (batch, num_heads, q_len, head_dim), the last q_len positions of ``key`` and ``value``
    (batch, num_kv_heads, k_len, head_dim). Returns (batch, q_len, num_heads, head_dim), as transformers'
    sdpa integration does.
    """
    request: FusedRequest | None = getattr(module, REQUEST, None)
    fusable = (
        request is not None
        and request.begin(query, key, attention_mask)
        and query.shape[2] > 1
        and not dropout
        and kwargs.get("sliding_window") is None
        and getattr(module, "is_causal", True)
    )
    if not fusable:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    batch, heads, kv_heads = query.shape[0], query.shape[1], key.shape[1]
    allowed = None if attention_mask is None or request.unpadded else mask_allows(attention_mask, key.shape[2])
    output = torch.empty_like(query)
    for first, probs in probability_chunks(query.float() * scale, key, request.chunk_size, allowed):
        stop, visible = first + probs.shape[2], probs.shape[-1]
        grouped = probs.to(query.dtype).view(batch, kv_heads, -1, visible)  # each KV head meets its query group
        output[:, :, first:stop] = torch.matmul(grouped, value[:, :, :visible]).view(batch, heads, stop - first, -1)
        request.add(first, probs)
    request.end()
    return output.transpose(1, 2).contiguous(), None


def register_fused_sdpa() -> None:
    """Register ``fused_sdpa`` (and sdpa's mask, so padding reaches it and it defers to sdpa) in transformers'
    attention registries under ``FUSED_SDPA``; registering again changes nothing."""
    AttentionInterface.register(FUSED_SDPA, fused_sdpa)
    AttentionMaskInterface.register(FUSED_SDPA, sdpa_mask)


@contextmanager
def fused_column_sums(
    model: PreTrainedModel,
    layers: nn.ModuleList,
    reader: ColumnSumReader,
    weights: torch.Tensor | None,
    chunk_size: int,
) -> Iterator[None]:
    """Inside the block, ``model`` runs ``fused_sdpa`` and the attention module of each of ``layers`` carries a
    ``ColumnSumRequest`` of ``reader``. Only a model running sdpa is switched: eager attention already hands out
    its weights, and other kernels are left alone (the press then recomputes the sums)."""
    requests = [ColumnSumRequest(reader, layer.self_attn.layer_idx, weights, chunk_size) for layer in layers]
    with requesting(model, layers, requests) as switched:
        try:
            yield
        finally:
            if switched:
                for request in requests:
                    reader.hand_column_sums(request.layer_idx, None)


@contextmanager
def requesting(model: PreTrainedModel, layers: nn.ModuleList, requests: list[FusedRequest]) -> Iterator[bool]:
    """Each of ``layers``' attention modules carries its request while ``model`` runs ``fused_sdpa``, if it ran
    sdpa; yields whether it was switched."""
    if model.config._attn_implementation != "sdpa":
        yield False
        return
    register_fused_sdpa()
    attentions = [layer.self_attn for layer in layers]
    for attention, request in zip(attentions, requests, strict=True):
        setattr(attention, REQUEST, request)
    try:
        with attention_implementation(model, FUSED_SDPA):
            yield True
    finally:
        for attention in attentions:
            delattr(attention, REQUEST)
