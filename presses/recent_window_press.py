from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress import ObservedAttentionPress
from kvpress.presses.base_press import BasePress
from kvpress.presses.scorer_press import ScorerPress
from kvpress.utils import compute_n_kept
from torch import nn
from transformers import PreTrainedModel

from presses.budget import protected_refusal
from presses.ordered_scorer_press import OrderedScorerPress, check_compression_ratio, gather_kept, kept_indices


@dataclass
class RecentWindowPress(BasePress):
    """A scorer's heavy hitters plus a recent window: the ``window`` newest positions are never evicted, the rest
    of the budget keeps what ``press`` scores highest.

    Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models", NeurIPS
    2023 (https://arxiv.org/abs/2306.14048), keep the recent tokens beside the heavy hitters. With the default
    ``press``, KVPress's ``ObservedAttentionPress`` (the attention each position received, averaged over the rows
    that saw it, in one pass: KVPress calls it related to H2O), this is an H2O-style cache with a fixed recent
    window, not H2O's greedy per-step eviction or its budget split. With ``window`` equal to an ``RMMPress``'s
    ``lag`` it protects exactly that press's provisional buffer, so the two differ only in how the committed
    positions are ranked: the control that separates RMM's commit lag from recency.

    The rule: the scores of ``press`` for every position, +inf for the ``window`` newest of the keys handed in
    (the last ``window`` tokens of a prefill); ties evict the lower position and kept entries stay in ascending
    order. The compression ratio is that of ``press``. Only ``press.score`` runs, so a press whose own
    ``compress`` or hooks decide more than its scores (``PyramidKVPress``'s per-layer budgets, ``RMMPress``'s
    smoother) is refused.

    Parameters
    ----------
    press : ScorerPress, default=ObservedAttentionPress()
        The scorer that ranks the positions outside the window: a ``ScorerPress`` whose ``compress`` keeps its
        highest scores.
    window : int, default=32
        How many of the newest positions are never evicted, >= 0 (0: ``press``'s ranking alone).
    """

    press: ScorerPress = field(default_factory=ObservedAttentionPress)
    window: int = 32

    def __post_init__(self) -> None:
        if not isinstance(self.press, ScorerPress):
            raise TypeError(f"press must be a KVPress ScorerPress, got {type(self.press).__name__}")
        cls = type(self.press)
        own = cls.compress not in (ScorerPress.compress, OrderedScorerPress.compress)
        if own or cls.__call__ is not BasePress.__call__ or cls.forward_hook is not BasePress.forward_hook:
            raise TypeError(
                f"{cls.__name__} decides more than its scores (its own compress or hooks), which a recent window "
                "would bypass: wrap a plain scorer such as ObservedAttentionPress, SnapKVPress or KnormPress"
            )
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
        refusal = protected_refusal(type(self).__name__, "window", self.window, n_kept)
        if refusal:
            raise ValueError(refusal)
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        return gather_kept(keys, values, kept_indices(scores, n_kept))
