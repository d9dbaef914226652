"""A press driven one arrival at a time on given attention rows, as ``DecodingPress`` drives it on a model.

The eviction lab and the controlled model replay presses on rows of attention they already hold (a recorded
trace, a simulated stream) rather than on a model. ``StreamedPress`` hands those rows to the press's own
``compress`` as a prefill followed by ``DecodingPress(compression_interval=1, target_size=budget)`` would:
the first ``budget`` positions as a prefill (observed, nothing evicted, as a prefill press at ratio 0 sees
it), then each new position's row over what the press holds, after which the press evicts to the budget
itself. Groups (layers, KV groups, random seeds) run side by
side as the press's KV heads. The keys it is given are the positions themselves, so what it keeps is read back
from the keys it returns: a stateful press (``RMMPress``'s smoother) is measured as users run it.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from kvpress import ScorerPress

from evaluation.catalogue.budgets import Budget

LAYER = SimpleNamespace(layer_idx=0)  # a stand-in attention layer: the rows are given, nothing is recomputed


class StreamedPress:
    """``press`` over ``groups`` streams, holding at most ``budget`` positions after every step."""

    def __init__(self, press: ScorerPress, budget: int, prefix_rows: torch.Tensor) -> None:
        """``prefix_rows`` (groups, budget, budget): the attention rows of the first ``budget`` positions."""
        self.press, self.budget = press, budget
        groups = prefix_rows.shape[0]
        self.held = torch.arange(budget).expand(groups, -1)
        press.compression_ratio = 0.0
        self._compress(prefix_rows, torch.arange(budget))

    def step(self, position: int, row: torch.Tensor) -> torch.Tensor:
        """Admit ``position`` with its row of attention (groups, held + 1) over the held positions (in ascending
        order) and itself; the press evicts to the budget. Returns the held positions (groups, <= budget)."""
        self.held = torch.cat([self.held, torch.full((self.held.shape[0], 1), position)], dim=1)
        self.press.compression_ratio = Budget("tokens", self.budget).compression_ratio(self.held.shape[1])
        self._compress(row[:, None], torch.tensor([position]))
        return self.held

    def _compress(self, rows: torch.Tensor, positions: torch.Tensor) -> None:
        n_rows, length = rows.shape[1], self.held.shape[1]
        keys = self.held[None, :, :, None].float()
        kwargs = {
            "hidden_states": torch.zeros(1, n_rows, 1),
            "cache_position": torch.arange(length - n_rows, length),
            "position_ids": positions[None],
        }
        kept, _ = self.press.compress(LAYER, kwargs["hidden_states"], keys, keys, rows[None].float(), kwargs)
        self.held = kept[0, :, :, 0].long()
