"""The selection rule shared by this package's presses."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress.presses.scorer_press import ScorerPress
from kvpress.utils import compute_n_kept
from torch import nn
from transformers import PreTrainedModel

from presses.flash_guard import FlashGuard


def kept_indices(scores: torch.Tensor, n_kept: int, keep_older: bool = False, tolerance: float = 0.0) -> torch.Tensor:
    """Indices of the ``n_kept`` highest scores along the last axis, in ascending order (NaN counts as +inf).

    Ties evict the lower position (the order of a stable ascending sort, whose first ``k_len - n_kept`` entries
    are the evicted ones), or with ``keep_older`` the higher one (a stable descending sort keeps the lower
    first). Decided without a sort or a wait for the device: every score above the ``n_kept``-th highest stays,
    and of those equal to it as many as fit, from the end that ties keep. With a ``tolerance`` > 0, a score within
    ``tolerance`` times the ``n_kept``-th highest's magnitude of it (a finite one) counts as equal to it: scores
    equal in exact arithmetic that float rounding set apart still tie.
    """
    scores = scores.nan_to_num(nan=float("inf"), posinf=float("inf"), neginf=float("-inf"))
    threshold = nth_highest(scores, n_kept) if n_kept else scores.new_full((1,), float("inf"))
    tied = scores == threshold
    if tolerance:
        tied |= threshold.isfinite() & ((scores - threshold).abs() <= tolerance * threshold.abs())
    above = (scores > threshold) & ~tied
    room = n_kept - above.sum(-1, keepdim=True)
    rank = tied.cumsum(-1) if keep_older else tied.flip(-1).cumsum(-1).flip(-1)
    kept = above | (tied & (rank <= room))
    slot = torch.where(kept, kept.cumsum(-1) - 1, n_kept)  # a kept position's place in the answer; n_kept: none
    positions = torch.arange(scores.shape[-1], device=scores.device).expand_as(scores)
    answer = torch.empty(*scores.shape[:-1], n_kept + 1, dtype=torch.long, device=scores.device)
    return answer.scatter_(-1, slot, positions)[..., :n_kept]


def nth_highest(scores: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n``-th highest of ``scores`` along the last axis, (..., 1): from whichever end is nearer (a stream
    that evicts one key of 257 asks for the 2nd lowest, not a top-256)."""
    below = scores.shape[-1] - n + 1
    if below < n:
        return scores.topk(below, dim=-1, largest=False).values[..., -1:]
    return scores.topk(n, dim=-1).values[..., -1:]


def gather_kept(keys: torch.Tensor, values: torch.Tensor, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries ``kept`` (batch, num_kv_heads, n_kept) of keys and values (batch, num_kv_heads, k_len, dim), as
    one ``index_select`` of whole rows over the flattened (batch x heads x positions) axis."""
    batch, heads, k_len = keys.shape[:3]
    start = torch.arange(0, batch * heads * k_len, k_len, device=kept.device).view(batch, heads, 1)
    rows = (kept + start).flatten()

    def pick(entries: torch.Tensor) -> torch.Tensor:
        return entries.reshape(-1, entries.shape[-1]).index_select(0, rows).view(*kept.shape, entries.shape[-1])

    return pick(keys), pick(values)


def check_compression_ratio(compression_ratio: float) -> None:
    if not 0 <= compression_ratio < 1:
        raise ValueError(
            f"compression_ratio must be in [0, 1) (the fraction of the cache to evict), got {compression_ratio}"
        )


@dataclass
class OrderedScorerPress(ScorerPress):
    """A ``ScorerPress`` that stores kept entries in ascending position order and evicts the lower position
    on ties (KVPress's ``ScorerPress`` keeps them in score order, with ``topk``'s unspecified tie order). Under
    flash attention, a padded forward over a cache it compressed is refused before it runs (``FlashGuard``)."""

    _flash_guard: FlashGuard = field(default_factory=FlashGuard, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_compression_ratio(self.compression_ratio)

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        if model.config._attn_implementation.startswith("flash"):
            self._flash_guard.attach(model, self)

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
