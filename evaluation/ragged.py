"""Batched decoding of caches of different lengths, with neither padding nor copies of the cache.

On a CPU, a decoding step is bound by the bytes it reads: every weight once per step, whatever the batch,
plus each sequence's cache. Batching every press's cache of one prompt into one step therefore reads the
weights once instead of once per cache. Padding the caches to a common length would make each sequence read
(and, through ``repeat_kv`` under a mask, copy) the longest cache; ``DynamicCache`` would copy the whole
cache at every step (``torch.cat``). Here instead:

- sequences of equal cache length form a *group*, laid out on consecutive batch rows;
- each layer keeps one buffer per group with room for the tokens decoding will add, so a step writes one
  position per sequence and the attention reads views of the buffers;
- the projections and MLPs run on the whole batch; the attention (``ragged_sdpa``) runs group by group, with
  sdpa over the group's own keys only, so no position is padded and no mask is needed.
"""

from __future__ import annotations

from itertools import accumulate
from typing import NamedTuple

import torch
from torch import nn
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin

from presses.attention import causal_mask

RAGGED_SDPA = "kvet_ragged_sdpa"


class Ragged(NamedTuple):
    """One layer's keys (or values) as a ``RaggedLayer`` hands them to the attention: per group, its batch rows
    and a view of shape (rows, num_kv_heads, length, head_dim)."""

    rows: list[slice]
    tensors: list[torch.Tensor]


class RaggedLayer(CacheLayerMixin):
    """One layer's cache for a batch of sequences whose lengths differ: one buffer per group of equal length."""

    is_sliding = False

    def __init__(self, keys: list[list[torch.Tensor]], values: list[list[torch.Tensor]], room: int) -> None:
        """``keys`` and ``values``: per group, in batch order, its sequences' (1, num_kv_heads, length, head_dim)
        tensors; ``room``: how many positions each buffer takes beyond its group's length before it must grow."""
        super().__init__()
        self.lengths = [group[0].shape[2] for group in keys]
        self.key_buffers = [_with_room(group, room) for group in keys]
        self.value_buffers = [_with_room(group, room) for group in values]
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("a RaggedLayer is built from existing caches (RaggedCache.from_caches)")

    def rows(self) -> list[slice]:
        """Each group's batch rows."""
        stops = list(accumulate(buffer.shape[0] for buffer in self.key_buffers))
        return [slice(stop - buffer.shape[0], stop) for stop, buffer in zip(stops, self.key_buffers, strict=True)]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs: dict | None = None
    ) -> tuple[Ragged, Ragged]:
        """Write the new positions (batch, num_kv_heads, new, head_dim) after each group's own length."""
        new = key_states.shape[2]
        rows = self.rows()
        for group, span in enumerate(rows):
            start, stop = self.lengths[group], self.lengths[group] + new
            if stop > self.key_buffers[group].shape[2]:
                self.key_buffers[group] = _with_room([self.key_buffers[group][:, :, :start]], max(start, new))
                self.value_buffers[group] = _with_room([self.value_buffers[group][:, :, :start]], max(start, new))
            self.key_buffers[group][:, :, start:stop] = key_states[span]
            self.value_buffers[group][:, :, start:stop] = value_states[span]
            self.lengths[group] = stop
        return (
            Ragged(rows, [buffer[:, :, :n] for buffer, n in zip(self.key_buffers, self.lengths, strict=True)]),
            Ragged(rows, [buffer[:, :, :n] for buffer, n in zip(self.value_buffers, self.lengths, strict=True)]),
        )

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the batch rows ``indices`` (ascending); groups left empty are dropped."""
        kept = set(indices.tolist())
        groups = []
        for span, keys, values, length in zip(
            self.rows(), self.key_buffers, self.value_buffers, self.lengths, strict=True
        ):
            local = [row - span.start for row in range(span.start, span.stop) if row in kept]
            if len(local) == keys.shape[0]:
                groups.append((keys, values, length))
            elif local:
                index = torch.tensor(local, device=keys.device)
                groups.append((keys[index], values[index], length))
        self.key_buffers = [keys for keys, _, _ in groups]
        self.value_buffers = [values for _, values, _ in groups]
        self.lengths = [length for _, _, length in groups]

    def get_seq_length(self) -> int:
        return max(self.lengths)

    def get_mask_sizes(self, cache_position: torch.Tensor) -> tuple[int, int]:
        return self.get_seq_length() + cache_position.shape[0], 0

    def get_max_cache_shape(self) -> int:
        return -1


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


class RaggedCache(Cache):
    """A batch of single-sequence caches of any lengths, decoded with the ``RAGGED_SDPA`` attention."""

    @classmethod
    def from_caches(cls, caches: list[DynamicCache], room: int) -> RaggedCache:
        """Batch row i holds ``caches[i]``; sequences of equal length must be adjacent (sort them by length).
        The caches are copied, never modified. ``room``: the positions decoding is expected to add."""
        lengths = [cache.get_seq_length() for cache in caches]
        starts = [i for i, n in enumerate(lengths) if i == 0 or n != lengths[i - 1]]
        if len(starts) != len(set(lengths)):
            raise ValueError(f"caches of equal length must be adjacent in the batch, got lengths {lengths}")
        spans = list(zip(starts, [*starts[1:], len(caches)], strict=True))
        layers = []
        for layer in range(len(caches[0].layers)):
            entries = [cache.layers[layer] for cache in caches]
            keys = [[entry.keys for entry in entries[a:b]] for a, b in spans]
            values = [[entry.values for entry in entries[a:b]] for a, b in spans]
            layers.append(RaggedLayer(keys, values, room))
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
    for rows, keys, values in zip(key.rows, key.tensors, value.tensors, strict=True):
        k_len = keys.shape[2]
        mask = None if q_len == 1 else causal_mask(torch.arange(k_len - q_len, k_len, device=query.device), k_len)
        output[rows] = nn.functional.scaled_dot_product_attention(
            query[rows], keys, values, attn_mask=mask, scale=scaling, enable_gqa=True
        )
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(RAGGED_SDPA, ragged_sdpa)
