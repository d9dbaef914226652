from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from presses.attention import attention_rows, group_mean, recomputed_keys
from presses.fingerprints import key_marks, nearest_slots
from presses.ordered_scorer_press import OrderedScorerPress


@dataclass
class TOVAPress(OrderedScorerPress):
    """TOVA: evict the positions the newest query attends to least.

    Oren et al., "Transformers are Multi-State RNNs", EMNLP 2024 (https://arxiv.org/abs/2401.06104).

    The rule: a cached position's score is the attention it receives from the newest query of the current
    forward pass, averaged over all query heads of the layer (one kept set per layer, as in the official
    TOVA code). Nothing is accumulated; there is no recency window and no sink rule. The newest token has not
    been attended by any later token, so it is never evicted on the step that admits it (score +inf). Ties
    evict the lower position and kept entries stay in ascending position order.

    With eager attention the layer's weights are read; otherwise the newest query's attention is recomputed
    from the hidden states and the rotary embeddings. As the ``base_press`` of
    ``DecodingPress(compression_interval=1, target_size=B)`` it is TOVA's multi-state-RNN form: the newest
    token's attention decides, at every step, which of the B + 1 states to drop.

    Parameters
    ----------
    compression_ratio : float, default=0.0
        Fraction of the cache to evict, in [0, 1).
    per_kv_group : bool, default=False
        Average over the query heads of each KV group instead of all heads, so each KV head keeps its own
        set. This is exactly ``SnapKVPress(window_size=1, kernel_size=1)``'s rule.
    """

    compression_ratio: float = 0.0
    per_kv_group: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.per_kv_group, bool):
            raise TypeError(f"per_kv_group must be True or False, got {self.per_kv_group!r}")

    def score(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor | None,
        kwargs: dict,
    ) -> torch.Tensor:
        num_kv_heads, k_len = keys.shape[1], keys.shape[2]
        # an earlier press of a ComposedPress may have evicted: score the prompt's keys, then take the survivors'
        evicted = hidden_states is not None and k_len < hidden_states.shape[1]
        full = recomputed_keys(module, hidden_states, kwargs) if evicted else keys
        _, newest = next(attention_rows(module, hidden_states, full, attentions, kwargs, n_rows=1).chunks)
        newest = newest[:, :, 0]  # (batch, num_heads, length), float32; includes the newest token's self-attention
        if self.per_kv_group:
            scores = group_mean(newest, num_kv_heads)
        else:
            scores = newest.mean(1, keepdim=True).expand(-1, num_kv_heads, -1).clone()
        scores[..., -1] = float("inf")
        return scores if full is keys else scores.gather(-1, nearest_slots(key_marks(full), key_marks(keys))[0])
