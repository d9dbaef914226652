"""The attention rows of the forward that extends a history, kept by that forward itself.

The history's column sums grow by the new rows' attention over the whole cache. A short extension (a turn) keeps
those rows from its own forward, which then runs ``presses.fused_attention.fused_sdpa`` (equal to sdpa within
float rounding), instead of a second pass of the rows' queries over the keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import PreTrainedModel

from presses.harness import group_mean, requesting


@dataclass
class RowsRequest:
    """Every query row's attention probabilities (float32, averaged over each KV group's query heads, as
    ``probability_chunks`` yields them): ``chunks`` of (first row, (batch, num_kv_heads, chunk, visible)).
    ``unpadded``: the caller's sequences have no padding, so the model's mask is causal and is not read."""

    chunk_size: int
    unpadded: bool = False
    chunks: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    _kv_heads: int = field(default=0, init=False, repr=False)

    def begin(self, query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
        self._kv_heads = key.shape[1]
        return True

    def add(self, first: int, probs: torch.Tensor) -> None:
        self.chunks.append((first, group_mean(probs, self._kv_heads)))

    def end(self) -> None:
        """Nothing to finish: the rows are kept as they come."""


@contextmanager
def fused_rows(
    model: PreTrainedModel, layers: nn.ModuleList, chunk_size: int, unpadded: bool
) -> Iterator[list[RowsRequest] | None]:
    """Inside the block, ``model`` runs ``fused_sdpa`` and each of ``layers`` keeps its rows in the yielded
    ``RowsRequest`` (None where the model does not run sdpa: nothing is switched, the caller recomputes)."""
    requests = [RowsRequest(chunk_size, unpadded) for _ in layers]
    with requesting(model, layers, requests) as switched:
        yield requests if switched else None
