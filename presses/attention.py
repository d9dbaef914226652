"""A layer's attention rows over its cache, chunk by chunk: read from eager weights or recomputed.

The presses here score cached positions from rows of attention: TOVA from the newest row, RMM from every row
with a per-row weight. With eager attention the layer's weights are read; otherwise the rows' queries are
recomputed from the layer's input hidden states and the rotary embeddings, ``chunk_size`` rows at a time, so
memory stays O(heads x chunk_size x length) and no (length x length) matrix is ever held. Either way the rows
are the newest ``n_rows`` positions of the cache (during prefill every prompt token, inside ``DecodingPress``
the buffered recent tokens), the probabilities are float32 whatever the model's dtype, and the model's own
attention mask is honoured: padding keys get no attention, padding rows are marked invalid, and a
sliding-window layer's mask is applied as the model applied it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from kvpress.utils import get_prerope_key_states, get_prerope_query_states
from torch import nn
from transformers import PreTrainedModel
from transformers.models.llama.modeling_llama import rotate_half

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


def recomputed_keys(module: nn.Module, hidden_states: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """Post-rotary keys of every row of ``hidden_states``, computed as the layer computed them in this forward:
    (batch, num_kv_heads, rows, head_dim)."""
    keys = get_prerope_key_states(module, hidden_states)
    cos, sin = row_rotary(module, hidden_states, kwargs)
    return keys * cos.unsqueeze(1) + rotate_half(keys) * sin.unsqueeze(1)


def row_positions(kwargs: dict, n_rows: int) -> torch.Tensor:
    """Absolute positions (batch, n_rows) of the newest ``n_rows`` rows: the forward's own ``position_ids`` (else its
    ``cache_position``) where they cover the rows, as the model and ``Transcript`` number them (left padding may
    repeat a position); rows buffered from earlier forwards take the consecutive positions before them."""
    positions = kwargs.get("position_ids")
    positions = kwargs["cache_position"][None] if positions is None else positions
    if positions.shape[-1] >= n_rows:
        return positions[:, -n_rows:]
    return positions[:, -1:] - n_rows + 1 + torch.arange(n_rows, device=positions.device)


def host_values(tensor: torch.Tensor) -> list:
    """``tensor.tolist()``, read from its device once per tensor: every layer of a forward is handed the same
    ``cache_position`` and ``position_ids``, so one wait for the device serves them all."""
    held = _HOST_VALUES.get(id(tensor))
    if held is not None and held[0]() is tensor:
        return held[1]
    key = id(tensor)
    _HOST_VALUES[key] = (weakref.ref(tensor, lambda _: _HOST_VALUES.pop(key, None)), tensor.tolist())
    return _HOST_VALUES[key][1]


_HOST_VALUES: dict[int, tuple[weakref.ref, list]] = {}


def newest_host_positions(kwargs: dict, n_rows: int) -> list[int]:
    """``row_positions(kwargs, n_rows)`` of the first sequence, on the host (``host_values``)."""
    positions = kwargs.get("position_ids")
    first = host_values(kwargs["cache_position"]) if positions is None else host_values(positions)[0]
    if len(first) >= n_rows:
        return first[len(first) - n_rows :]
    return list(range(first[-1] - n_rows + 1, first[-1] + 1))


def is_prefilling(kwargs: dict, q_len: int) -> bool:
    """KVPress's test of a prefill (the forward's last cache position is its ``q_len``-th), on the host."""
    return host_values(kwargs["cache_position"])[-1] + 1 == q_len


def causal_mask(rows: torch.Tensor, k_len: int) -> torch.Tensor:
    """(n_rows, k_len) boolean: the row at cache index t sees the key at index k when k <= t."""
    return torch.arange(k_len, device=rows.device)[None, :] <= rows[:, None]


def sliding_window(module: nn.Module) -> int | None:
    """The layer's sliding attention window, if it has one (Qwen2 sets it per layer, Mistral in its config)."""
    if hasattr(module, "sliding_window"):
        return module.sliding_window
    return getattr(getattr(module, "config", None), "sliding_window", None)


@dataclass(frozen=True)
class RowMask:
    """What the model's attention mask allows the newest ``n_rows`` rows: ``allowed`` (batch, 1, n_rows, k_len),
    or None for plain causal attention; ``valid`` (batch, n_rows): False for padding rows, None when none are."""

    allowed: torch.Tensor | None
    valid: torch.Tensor | None


def row_mask(module: nn.Module, kwargs: dict, n_rows: int, k_len: int, device: torch.device) -> RowMask:
    """The model's attention mask for the newest ``n_rows`` rows over ``k_len`` keys.

    Rows of the current forward read the 4-D mask the model used (padding, causality and any sliding window).
    Rows buffered from earlier forwards (inside ``DecodingPress``) keep the current row's padding keys (left
    padding is the same for every row); their sliding window is not known, so such a layer is refused. Without a
    4-D mask (flash attention passes a 2-D padding mask, or none), the mask is built as the model applies it:
    causal, the 2-D mask's padding keys excluded, and the layer's sliding window.
    """
    mask, window = kwargs.get("attention_mask"), sliding_window(module)
    if mask is not None and mask.ndim == 2:
        mask = None if bool(mask.all()) else mask
        if mask is not None and mask.shape[-1] != k_len:
            raise ValueError(
                f"a padding mask over {mask.shape[-1]} positions no longer lines up with a cache of {k_len} keys: "
                "score padded batches before any compression, or without flash attention"
            )
    if mask is None or mask.ndim == 2:
        if mask is None and window is None:
            return RowMask(None, None)
        rows = torch.arange(k_len - n_rows, k_len, device=device)
        allowed = causal_mask(rows, k_len)
        if window is not None:
            allowed &= torch.arange(k_len, device=device)[None, :] > rows[:, None] - window
        if mask is None:
            return RowMask(allowed[None, None], None)
        keys_valid = mask.to(device).bool()
        return RowMask(allowed[None, None] & keys_valid[:, None, None, :], keys_valid[:, -n_rows:])
    allowed = mask_allows(mask, k_len)
    q_len = allowed.shape[2]
    if n_rows > q_len:
        if window is not None:
            raise ValueError(
                f"layer {module.layer_idx} uses sliding-window attention: scoring rows buffered over several decoding "
                "steps would need each row's window, which the model does not pass; use a model without sliding "
                "windows inside DecodingPress"
            )
        keys_valid = allowed[:, :, -1:, :]
        allowed = keys_valid & causal_mask(torch.arange(k_len - n_rows, k_len, device=mask.device), k_len)
    else:
        allowed = allowed[:, :, -n_rows:]
    own = torch.arange(k_len - n_rows, k_len, device=mask.device)
    valid = allowed[:, 0, torch.arange(n_rows, device=mask.device), own]
    return RowMask(allowed, None if valid.all() else valid)


def mask_allows(mask: torch.Tensor, k_len: int) -> torch.Tensor:
    """A 4-D attention mask (boolean, or additive float) as what it allows over the first ``k_len`` keys:
    (batch, 1, q_len, k_len) booleans."""
    return (mask if mask.dtype == torch.bool else mask == 0)[..., :k_len]


def probability_chunks(
    queries: torch.Tensor,
    keys: torch.Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    allowed: torch.Tensor | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """The attention of the newest rows of the cache, ``chunk_size`` rows at a time, in float32.

    ``queries``: post-rotary and already scaled, (batch, num_heads, n_rows, head_dim), for the last n_rows
    positions of ``keys`` (batch, num_kv_heads, k_len, head_dim); ``allowed``: the model's mask (``RowMask``),
    or None for causal attention. Yields ``(first, probs)``: the chunk's first row (0 is the oldest of the
    n_rows) and its probabilities (logits, softmax and all in float32, whatever the model's dtype),
    (batch, num_heads, chunk, visible), over the keys up to the chunk's last row
    (later keys are masked for every row of the chunk, so they are skipped). A row that may see nothing (a
    padding row) gets all zeros.
    """
    k_len, n_rows = keys.shape[2], queries.shape[2]
    batch, num_heads, num_kv_heads = queries.shape[0], queries.shape[1], keys.shape[1]
    # logits accumulate in float32 from the model's (possibly bf16) queries and keys; a no-op for float32 models.
    # Each KV head's keys meet its whole group of query heads in one product, so no key is copied per query head.
    keys = keys.float().transpose(2, 3)
    for start in range(0, n_rows, chunk_size):
        stop = min(start + chunk_size, n_rows)
        visible = k_len - n_rows + stop
        grouped = queries[:, :, start:stop].float().reshape(batch, num_kv_heads, -1, queries.shape[-1])
        logits = torch.matmul(grouped, keys[..., :visible]).view(batch, num_heads, stop - start, visible)
        if allowed is None:
            block = visible - (stop - start)  # only the chunk's own square block holds keys later than some row
            rows = torch.arange(stop - start, device=keys.device)
            logits[..., block:].masked_fill_(~causal_mask(rows, stop - start), float("-inf"))
            yield start, nn.functional.softmax(logits, dim=-1)  # every row sees its own key
        else:
            logits.masked_fill_(~allowed[:, :, start:stop, :visible], float("-inf"))
            yield start, nn.functional.softmax(logits, dim=-1).nan_to_num_(0.0)


@dataclass(frozen=True)
class AttentionRows:
    """The newest ``n_rows`` rows of a layer's attention over its ``k_len`` cached keys, in chunks."""

    chunks: Iterator[tuple[int, torch.Tensor]]  # (first row, float32 probs (batch, num_heads, chunk, visible))
    valid: torch.Tensor | None  # (batch, n_rows): False for padding rows; None when every row is a token


def attention_rows(
    module: nn.Module,
    hidden_states: torch.Tensor,
    keys: torch.Tensor,
    attentions: torch.Tensor | None,
    kwargs: dict,
    n_rows: int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> AttentionRows:
    """The newest ``n_rows`` rows (default: every row of ``hidden_states``) of the layer's attention.

    ``hidden_states`` (batch, rows, hidden) is the layer's input for at least those rows; ``keys`` the
    post-rotary cache (batch, num_kv_heads, k_len, head_dim); ``attentions`` the eager weights of the current
    forward, read when they cover the rows and the keys, else the rows are recomputed.
    """
    n_rows = n_rows or hidden_states.shape[1]
    k_len = keys.shape[2]
    mask = row_mask(module, kwargs, n_rows, k_len, keys.device)
    if attentions is not None and attentions.shape[2] >= n_rows and attentions.shape[-1] == k_len:
        rows = attentions[:, :, -n_rows:].float()
        if mask.valid is not None:
            rows = rows * mask.valid[:, None, :, None]  # an eager padding row attends uniformly: it is no token
        chunks = ((start, rows[:, :, start : start + chunk_size]) for start in range(0, n_rows, chunk_size))
        return AttentionRows(chunks, mask.valid)
    queries = row_queries(module, hidden_states[:, -n_rows:], kwargs).float() * module.scaling
    return AttentionRows(probability_chunks(queries, keys, chunk_size, mask.allowed), mask.valid)


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
