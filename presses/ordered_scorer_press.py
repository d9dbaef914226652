"""The selection rule shared by this package's presses."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpress.presses.scorer_press import ScorerPress
from kvpress.utils import compute_n_kept
from torch import nn


def kept_indices(scores: torch.Tensor, n_kept: int, keep_older: bool = False) -> torch.Tensor:
    """Indices of the ``n_kept`` highest scores along the last axis, in ascending order.

    Ties evict the lower position (a stable ascending sort puts the lower of two equal scores first, and the
    first ``k_len - n_kept`` entries of that order are the evicted ones), or with ``keep_older`` the higher one
    (a stable descending sort keeps the lower first).
    """
    if keep_older:
        return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :n_kept].sort(dim=-1).values
    order = torch.sort(scores, dim=-1, stable=True).indices
    return order[..., scores.shape[-1] - n_kept :].sort(dim=-1).values


def gather_kept(keys: torch.Tensor, values: torch.Tensor, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries ``kept`` (batch, num_kv_heads, n_kept) of keys and values (batch, num_kv_heads, k_len, head_dim)."""
    index = kept.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
    return keys.gather(2, index).contiguous(), values.gather(2, index).contiguous()


def check_compression_ratio(compression_ratio: float) -> None:
    if not 0 <= compression_ratio < 1:
        raise ValueError(
            f"compression_ratio must be in [0, 1) (the fraction of the cache to evict), got {compression_ratio}"
        )


@dataclass
class OrderedScorerPress(ScorerPress):
    """A ``ScorerPress`` that stores kept entries in ascending position order and evicts the lower position
    on ties (KVPress's ``ScorerPress`` keeps them in score order, with ``topk``'s unspecified tie order)."""

    def __post_init__(self) -> None:
        check_compression_ratio(self.compression_ratio)

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_compression_ratio(self.compression_ratio)
        if self.compression_ratio == 0:
            return keys, values
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        return gather_kept(keys, values, self.select(scores, compute_n_kept(keys.shape[2], self.compression_ratio)))

    def select(self, scores: torch.Tensor, n_kept: int) -> torch.Tensor:
        """The positions kept of ``scores`` (batch, num_kv_heads, k_len): the ``n_kept`` highest, ties evicting the
        lower position, in ascending order."""
        return kept_indices(scores, n_kept)
