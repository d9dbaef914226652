"""Attention statistics computed from queries and keys, chunk by chunk.

The presses here score cached positions by column sums of attention over a set of query rows: TOVA over
the newest row, RMM over every row with a per-row weight. With eager attention the layer's weights are
read directly; otherwise the rows' queries are recomputed from the layer's input hidden states and the
rotary embeddings, and the sums are accumulated ``chunk_size`` rows at a time, so memory stays
O(heads x chunk_size x length) and no (length x length) matrix is ever held. ``presses.fused_attention``
sums the same chunks (``probability_chunks``) while it computes the layer's attention output.

The rows are always the last ``n_rows`` positions of the cache: during prefill, every prompt token;
during decoding (inside ``DecodingPress``), the buffered recent tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from kvpress.utils import get_prerope_query_states
from torch import nn
from transformers import PreTrainedModel
from transformers.models.llama.modeling_llama import repeat_kv, rotate_half

DEFAULT_CHUNK_SIZE = 64  # query rows per chunk: a chunk holds num_heads x 64 x length probabilities


def row_rotary(module: nn.Module, hidden_rows: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary (cos, sin) for the rows of ``hidden_rows``, the newest row being the current token.

    Rows that precede the current forward pass (a decoding buffer) take the consecutive positions before it.
    """
    cos, sin = kwargs["position_embeddings"]
    n_rows = hidden_rows.shape[1]
    if cos.shape[-2] >= n_rows:
        return cos[:, -n_rows:], sin[:, -n_rows:]
    newest = kwargs["position_ids"][:, -1:]
    positions = newest - n_rows + 1 + torch.arange(n_rows, device=newest.device)
    return module.rotary_emb(hidden_rows, positions)


def row_queries(module: nn.Module, hidden_rows: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """Post-rotary queries of the rows, shape (batch, num_heads, n_rows, head_dim)."""
    queries = get_prerope_query_states(module, hidden_rows)
    cos, sin = row_rotary(module, hidden_rows, kwargs)
    return queries * cos.unsqueeze(1) + rotate_half(queries) * sin.unsqueeze(1)


def band_mask(rows: torch.Tensor, k_len: int, lag: int | None) -> torch.Tensor:
    """(n_rows, k_len) boolean: row t sees key k when k <= t, and t - k <= lag if a lag is given."""
    keys = torch.arange(k_len, device=rows.device)
    distance = rows[:, None] - keys[None, :]
    visible = distance >= 0
    if lag is not None:
        visible &= distance <= lag
    return visible


def rows_per_key(k_len: int, n_rows: int, lag: int | None, device: torch.device) -> torch.Tensor:
    """How many of the last ``n_rows`` rows count towards each key (its causal, lag-limited rows)."""
    first_row = k_len - n_rows
    keys = torch.arange(k_len, device=device)
    last = torch.full_like(keys, k_len - 1) if lag is None else (keys + lag).clamp(max=k_len - 1)
    return (last - keys.clamp(min=first_row) + 1).clamp(min=1)


def attention_column_sums(
    module: nn.Module,
    hidden_states: torch.Tensor,
    keys: torch.Tensor,
    attentions: torch.Tensor | None,
    kwargs: dict,
    n_rows: int | None = None,
    row_weights: torch.Tensor | None = None,
    lag: int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """Sum over the last ``n_rows`` query rows t of ``w(t) * a(t -> k)``, per query head.

    Parameters
    ----------
    module : nn.Module
        The attention layer (its projections, head counts and scaling are used).
    hidden_states : torch.Tensor
        The layer's input, shape (batch, q_len, hidden); used only when ``attentions`` is None.
    keys : torch.Tensor
        Post-rotary cached keys, shape (batch, num_kv_heads, k_len, head_dim).
    attentions : torch.Tensor or None
        Eager attention weights, shape (batch, num_heads, q_len, k_len), or None to recompute.
    n_rows : int, optional
        How many of the newest rows to sum over; all available rows by default.
    row_weights : torch.Tensor, optional
        Shape (batch, n_rows); None means every row weighs 1 (and no multiplication happens).
    lag : int, optional
        Only rows t with t - k <= lag count towards key k.

    Returns
    -------
    torch.Tensor
        Shape (batch, num_heads, k_len).
    """
    k_len = keys.shape[2]
    if attentions is not None:
        n_rows = n_rows or attentions.shape[2]
        probs = attentions[..., -n_rows:, :]
        if lag is not None:
            rows = torch.arange(k_len - n_rows, k_len, device=keys.device)
            probs = probs * band_mask(rows, k_len, lag).to(probs.dtype)
        if row_weights is not None:
            probs = probs * row_weights[:, None, :, None].to(probs.dtype)
        return probs.sum(2)

    return recomputed_column_sums(module, hidden_states, keys, kwargs, [row_weights], n_rows, lag, chunk_size)[0]


def recomputed_column_sums(
    module: nn.Module,
    hidden_states: torch.Tensor,
    keys: torch.Tensor,
    kwargs: dict,
    weightings: list[torch.Tensor | None],
    n_rows: int | None = None,
    lag: int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> list[torch.Tensor]:
    """``attention_column_sums`` without eager weights, for several row weightings from one pass over the rows:
    each chunk's attention is computed once and summed once per weighting (None: every row weighs 1)."""
    n_rows = n_rows or hidden_states.shape[1]
    sums = zero_sums(keys, module.config.num_attention_heads, len(weightings))
    for rows, chunk in attention_row_chunks(module, hidden_states[:, -n_rows:], keys, kwargs, chunk_size):
        add_column_sums(sums, weightings, rows, chunk, n_rows, lag)
    return [total.to(keys.dtype) for total in sums]


def zero_sums(keys: torch.Tensor, num_heads: int, count: int) -> list[torch.Tensor]:
    """``count`` float32 accumulators of shape (batch, num_heads, k_len) for the column sums over ``keys``."""
    shape = (keys.shape[0], num_heads, keys.shape[2])
    return [torch.zeros(shape, dtype=torch.float32, device=keys.device) for _ in range(count)]


def add_column_sums(
    sums: list[torch.Tensor],
    weightings: list[torch.Tensor | None],
    rows: torch.Tensor,
    probs: torch.Tensor,
    n_rows: int,
    lag: int | None,
) -> None:
    """Add one chunk of ``probability_chunks`` to each weighting's sums (batch, num_heads, k_len).

    ``weightings``: per sum, the (batch, n_rows) weights of the last ``n_rows`` rows, or None for all ones.
    """
    if lag is not None:
        probs = probs * band_mask(rows, probs.shape[-1], lag).to(probs.dtype)
    first = rows[0] - (sums[0].shape[-1] - n_rows)
    for total, row_weights in zip(sums, weightings, strict=True):
        weighted = probs
        if row_weights is not None:
            weighted = probs * row_weights[:, None, first : first + len(rows), None].to(probs.dtype)
        total[..., : probs.shape[-1]] += weighted.sum(2)


def attention_row_chunks(
    module: nn.Module,
    hidden_rows: torch.Tensor,
    keys: torch.Tensor,
    kwargs: dict,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``probability_chunks`` for the rows of ``hidden_rows`` (the newest rows of the cache), whose queries are
    recomputed from the layer's input."""
    queries = row_queries(module, hidden_rows, kwargs) * module.scaling
    return probability_chunks(queries, keys, chunk_size)


def probability_chunks(
    queries: torch.Tensor, keys: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The causal attention of the newest rows of the cache, ``chunk_size`` rows at a time.

    ``queries``: post-rotary and already scaled, (batch, num_heads, n_rows, head_dim), for the last n_rows
    positions of ``keys`` (batch, num_kv_heads, k_len, head_dim). Yields ``(rows, probs)``: the chunk's row
    positions in the cache, shape (chunk,), and its attention probabilities, shape
    (batch, num_heads, chunk, visible), over the keys up to the chunk's last row (later keys are masked for
    every row of the chunk, so they are skipped).
    """
    k_len, n_rows = keys.shape[2], queries.shape[2]
    keys = repeat_kv(keys, queries.shape[1] // keys.shape[1]).transpose(2, 3)
    for start in range(0, n_rows, chunk_size):
        stop = min(start + chunk_size, n_rows)
        visible = k_len - n_rows + stop
        rows = torch.arange(visible - (stop - start), visible, device=keys.device)
        logits = torch.matmul(queries[:, :, start:stop], keys[..., :visible])
        block = visible - (stop - start)  # only the chunk's own square block holds keys later than some row
        logits[..., block:].masked_fill_(~band_mask(rows - block, stop - start, None), float("-inf"))
        yield rows, nn.functional.softmax(logits, dim=-1, dtype=torch.float32).to(queries.dtype)


def group_mean(scores: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """Average per-query-head scores (batch, num_heads, ...) over each KV group: (batch, num_kv_heads, ...)."""
    return scores.unflatten(1, (num_kv_heads, -1)).mean(2)


@contextmanager
def attention_implementation(model: PreTrainedModel, name: str) -> Iterator[None]:
    """Run ``model``'s attention with the implementation ``name`` inside the block, then restore the previous one."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
