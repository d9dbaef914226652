"""Batched decoding of caches of different lengths, with neither padding nor copies of the cache at each step.

On a CPU, a decoding step is bound by the bytes it reads: every weight once per step, whatever the batch,
plus each sequence's cache. Batching every press's cache of one prompt into one step therefore reads the
weights once instead of once per cache. Padding the caches to a common length would make each sequence read
(and, through ``repeat_kv`` under a mask, copy) the longest cache; ``DynamicCache`` would copy the whole
cache at every step (``torch.cat``). Here instead:

- in each layer, the sequences whose cache has the same length there form a *group* (a press such as PyramidKV
  keeps a different length in each layer, so groups are per layer);
- each group keeps one buffer with room for the tokens decoding will add, so a step writes one position per
  sequence and the attention reads views of the buffers;
- the projections and MLPs run on the whole batch; the attention (``ragged_sdpa``) runs group by group, with
  sdpa over the group's own keys only, so no position is padded. A press that masks keys it keeps in memory
  (AdaKV's head-wise eviction) hands a mask, applied to its sequence's rows only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin

from evaluation.engine.hooks import Compressed
from presses.harness import causal_mask

RAGGED_SDPA = "kvet_ragged_sdpa"


class Ragged(NamedTuple):
    """One layer's keys (or values) as a ``RaggedLayer`` hands them to the attention: per group, its batch rows
    (indices), a view of shape (rows, num_kv_heads, length, head_dim), and which keys each row may see,
    (rows, num_kv_heads, length) booleans, or None when it sees them all."""

    rows: list[torch.Tensor | slice]
    tensors: list[torch.Tensor]
    visible: list[torch.Tensor | None]


class Group(NamedTuple):
    rows: list[int]  # batch rows, ascending
    index: torch.Tensor | slice  # the same, as a slice when they are consecutive (a view, no gather), else a tensor
    keys: torch.Tensor  # (rows, num_kv_heads, length + room, head_dim)
    values: torch.Tensor
    visible: torch.Tensor | None  # (rows, num_kv_heads, length + room), or None: every key visible
    length: int


class RaggedLayer(CacheLayerMixin):
    """One layer's cache for a batch of sequences whose lengths differ: one buffer per group of equal length."""

    is_sliding = False

    def __init__(
        self, keys: list[torch.Tensor], values: list[torch.Tensor], masks: list[torch.Tensor | None], room: int
    ) -> None:
        """Per sequence in batch order: its (1, num_kv_heads, length, head_dim) keys and values and its mask
        (1, num_kv_heads, length), True for a key no query may see (None: none); ``room``: how many positions
        each buffer takes beyond its group's length before it must grow."""
        super().__init__()
        by_length: dict[int, list[int]] = {}
        for row, tensor in enumerate(keys):
            by_length.setdefault(tensor.shape[2], []).append(row)
        self.groups = [
            Group(
                rows,
                row_index(rows, keys[0].device),
                _with_room([keys[row] for row in rows], room),
                _with_room([values[row] for row in rows], room),
                _visible([masks[row] for row in rows], keys[rows[0]], room),
                length,
            )
            for length, rows in by_length.items()
        ]
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("a RaggedLayer is built from existing caches (RaggedCache.from_caches)")

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs: dict | None = None
    ) -> tuple[Ragged, Ragged]:
        """Write the new positions (batch, num_kv_heads, new, head_dim) after each group's own length."""
        new = key_states.shape[2]
        for index, group in enumerate(self.groups):
            start, stop = group.length, group.length + new
            if stop > group.keys.shape[2]:
                room = max(start, new)
                visible = None
                if group.visible is not None:
                    visible = group.visible.new_ones(*group.visible.shape[:2], start + room)
                    visible[..., :start] = group.visible[..., :start]
                grown = (_with_room([group.keys[:, :, :start]], room), _with_room([group.values[:, :, :start]], room))
                group = group._replace(keys=grown[0], values=grown[1], visible=visible)
            group.keys[:, :, start:stop] = key_states[group.index]
            group.values[:, :, start:stop] = value_states[group.index]
            self.groups[index] = group._replace(length=stop)
        visible = [None if g.visible is None else g.visible[..., : g.length] for g in self.groups]
        rows = [g.index for g in self.groups]
        return (
            Ragged(rows, [g.keys[:, :, : g.length] for g in self.groups], visible),
            Ragged(rows, [g.values[:, :, : g.length] for g in self.groups], visible),
        )

    def keep_rows(self, kept: list[int]) -> None:
        """Keep only the batch rows ``kept`` (ascending), renumbered 0.. in that order; empty groups go. Host lists
        throughout: nothing waits for the device."""
        renumber = {row: new for new, row in enumerate(kept)}
        groups = []
        for group in self.groups:
            local = [i for i, row in enumerate(group.rows) if row in renumber]
            rows = [renumber[group.rows[i]] for i in local]
            if not local:
                continue
            index = row_index(rows, group.keys.device)
            if len(local) == len(group.rows):
                groups.append(group._replace(rows=rows, index=index))
                continue
            picked = torch.tensor(local, dtype=torch.long, device=group.keys.device)
            visible = None if group.visible is None else group.visible[picked]
            groups.append(Group(rows, index, group.keys[picked], group.values[picked], visible, group.length))
        self.groups = groups

    def get_seq_length(self) -> int:
        return max(group.length for group in self.groups)

    def get_mask_sizes(self, cache_position: torch.Tensor) -> tuple[int, int]:
        return self.get_seq_length() + cache_position.shape[0], 0

    def get_max_cache_shape(self) -> int:
        return -1


def row_index(rows: list[int], device: torch.device) -> torch.Tensor | slice:
    """How a group's batch ``rows`` (ascending) index the batch: a slice when they are consecutive (every group of
    one sequence), whose views cost no gather, else a tensor on ``device``."""
    if rows == list(range(rows[0], rows[-1] + 1)):
        return slice(rows[0], rows[-1] + 1)
    return torch.tensor(rows, dtype=torch.long, device=device)


def _with_room(parts: list[torch.Tensor], room: int) -> torch.Tensor:
    """One buffer holding ``parts`` (equal but for axis 0) stacked on axis 0, then ``room`` unused positions
    on axis 2."""
    batch, heads, length, head_dim = sum(part.shape[0] for part in parts), *parts[0].shape[1:]
    buffer = parts[0].new_empty((batch, heads, length + room, head_dim))
    row = 0
    for part in parts:
        buffer[row : row + part.shape[0], :, :length] = part
        row += part.shape[0]
    return buffer


def _visible(masks: list[torch.Tensor | None], keys: torch.Tensor, room: int) -> torch.Tensor | None:
    """One group's visibility buffer (rows, num_kv_heads, length + room) from its sequences' masks, or None when
    no sequence masks anything."""
    if all(mask is None for mask in masks):
        return None
    visible = torch.ones(len(masks), keys.shape[1], keys.shape[2] + room, dtype=torch.bool, device=keys.device)
    for row, mask in enumerate(masks):
        if mask is not None:
            visible[row, :, : keys.shape[2]] = ~mask[0].to(keys.device)
    return visible


class RaggedCache(Cache):
    """A batch of single-sequence caches of any lengths, decoded with the ``RAGGED_SDPA`` attention."""

    @contextmanager
    def scratch(self) -> Iterator[None]:
        """What the block appends is forgotten when it exits: every group's length is restored, so the positions it
        wrote are free again and overwritten by the next append before anything reads them (a teacher-forced pass
        leaves the batch's caches as they were, neither copied nor changed)."""
        lengths = [[group.length for group in layer.groups] for layer in self.layers]
        try:
            yield
        finally:
            for layer, kept in zip(self.layers, lengths, strict=True):
                layer.groups = [group._replace(length=n) for group, n in zip(layer.groups, kept, strict=True)]

    def keep_rows(self, kept: list[int]) -> None:
        """Keep only the batch rows ``kept`` (ascending) in every layer."""
        for layer in self.layers:
            layer.keep_rows(kept)

    @classmethod
    def from_caches(cls, caches: list[Compressed], room: int, consume: bool = False) -> RaggedCache:
        """Batch row i holds ``caches[i]``; ``room``: the positions decoding is expected to add. The caches are
        copied into the batch's buffers and otherwise left as they are; with ``consume``, each layer of the caches
        it owns is released once copied (replaced by an empty tensor: a view would keep its storage alive), so the
        batch never holds a second copy of them."""
        layers = []
        for layer in range(len(caches[0].masks)):
            entries = [cache.cache.layers[layer] for cache in caches]
            masks = [cache.masks[layer] for cache in caches]
            layers.append(RaggedLayer([e.keys for e in entries], [e.values for e in entries], masks, room))
            if consume:
                for cache, entry in zip(caches, entries, strict=True):
                    if cache.owned:
                        entry.keys, entry.values = entry.keys[:, :, :0].clone(), entry.values[:, :, :0].clone()
        return cls(layers=layers)


def ragged_sdpa(
    module: nn.Module,
    query: torch.Tensor,
    key: Ragged,
    value: Ragged,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The attention of a ``RaggedCache`` batch: sdpa group by group over the group's own keys.

    ``query``: (batch, num_heads, q_len, head_dim); the new positions are the last q_len of every group's
    keys, and each sees the keys up to itself. Returns (batch, q_len, num_heads, head_dim), as sdpa's
    transformers integration does.
    """
    if not isinstance(key, Ragged):
        raise TypeError(f"{RAGGED_SDPA} attends over a RaggedCache only; got keys of type {type(key).__name__}")
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError(f"{RAGGED_SDPA} does not implement sliding-window attention")
    q_len = query.shape[2]
    output = torch.empty_like(query)
    for rows, keys, values, visible in zip(key.rows, key.tensors, value.tensors, key.visible, strict=True):
        k_len = keys.shape[2]
        mask = None if q_len == 1 else causal_mask(torch.arange(k_len - q_len, k_len, device=query.device), k_len)
        if visible is not None:  # keys a press masks (AdaKV's head-wise eviction), per KV head
            heads = visible.repeat_interleave(query.shape[1] // keys.shape[1], dim=1)[:, :, None]
            mask = heads if mask is None else heads & mask
        output[rows] = nn.functional.scaled_dot_product_attention(
            query[rows], keys, values, attn_mask=mask, scale=scaling, enable_gqa=True
        )
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(RAGGED_SDPA, ragged_sdpa)
