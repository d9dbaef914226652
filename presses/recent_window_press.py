from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress import ObservedAttentionPress
from kvpress.presses.base_press import BasePress
from kvpress.presses.scorer_press import ScorerPress
from kvpress.utils import compute_n_kept
from torch import nn
from transformers import PreTrainedModel

from presses.ordered_scorer_press import check_compression_ratio, gather_kept, kept_indices


@dataclass
class RecentWindowPress(BasePress):
    """A scorer's heavy hitters plus a recent window: the ``window`` newest positions are never evicted, the rest
    of the budget keeps what ``press`` scores highest.

    Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models", NeurIPS
    2023 (https://arxiv.org/abs/2306.14048), keep the recent tokens beside the heavy hitters; with the default
    ``press`` (KVPress's ``ObservedAttentionPress``) this is that cache. With ``window`` equal to an
    ``RMMPress``'s ``lag`` it protects exactly that press's provisional buffer, so the two differ only in how
    the committed positions are ranked: the control that separates RMM's commit lag from recency.

    The rule: the scores of ``press`` for every position, +inf for the ``window`` newest of the keys handed in
    (the last ``window`` tokens of a prefill); ties evict the lower position and kept entries stay in ascending
    order. The compression ratio is that of ``press``.

    Parameters
    ----------
    press : ScorerPress, default=ObservedAttentionPress()
        The scorer that ranks the positions outside the window.
    window : int, default=32
        How many of the newest positions are never evicted, >= 0 (0: ``press``'s ranking alone).
    """

    press: ScorerPress = field(default_factory=ObservedAttentionPress)
    window: int = 32

    def __post_init__(self) -> None:
        if not isinstance(self.press, ScorerPress):
            raise TypeError(f"press must be a KVPress ScorerPress, got {type(self.press).__name__}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ValueError(f"window must be an integer >= 0 (newest positions never evicted), got {self.window!r}")

    @property
    def compression_ratio(self) -> float:
        return self.press.compression_ratio

    @compression_ratio.setter
    def compression_ratio(self, value: float) -> None:
        self.press.compression_ratio = value

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        self.press.post_init_from_model(model)

    def score(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor | None,
        kwargs: dict,
    ) -> torch.Tensor:
        scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs).clone()
        if self.window:
            scores[..., -self.window :] = float("inf")
        return scores

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor | None,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_compression_ratio(self.compression_ratio)
        if self.compression_ratio == 0:
            return keys, values
        n_kept = compute_n_kept(keys.shape[2], self.compression_ratio)
        if self.window >= n_kept:
            raise ValueError(
                f"RecentWindowPress(window={self.window}) never evicts its {self.window} newest positions, but the "
                f"budget keeps only {n_kept}: use a window below {n_kept}"
            )
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        return gather_kept(keys, values, kept_indices(scores, n_kept))
