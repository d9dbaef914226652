"""A press driven one arrival at a time on given attention rows, as ``DecodingPress`` drives it on a model.

The eviction lab and the controlled model replay presses on rows of attention they already hold (a recorded
trace, a simulated stream) rather than on a model. ``StreamedPress`` hands those rows to the press's own
``compress`` as a prefill followed by ``DecodingPress(compression_interval=1, target_size=budget)`` would:
the first ``budget`` positions as a prefill (observed, nothing evicted, as a prefill press at ratio 0 sees
it), then each new position's row over what the press holds, after which the press evicts to the budget
itself. Groups (layers, KV groups, random seeds) run side by
side as the press's KV heads. The keys it is given are the positions themselves, so what it keeps is read back
from the keys it returns: a stateful press (``RMMPress``'s smoother) is measured as users run it.

A press that reads teacher-forced correctness (``RMMPress(correctness="teacher_forced")``) reads it from the
transcript a model's hooks would fill (``presses.teacher_forcing.Transcript``); here ``StreamedPress`` fills it from
the trace's correctness as the positions arrive, so the press learns row t's correctness when position t + 1
arrives, as it does on a model, and counts row t as correct until then (``Smoother.revise``).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from kvpress import ScorerPress

from evaluation.catalogue.budgets import Budget

LAYER = SimpleNamespace(layer_idx=0)  # a stand-in attention layer: the rows are given, nothing is recomputed


class StreamedPress:
    """``press`` over ``groups`` streams, holding at most ``budget`` positions after every step."""

    def __init__(
        self, press: ScorerPress, budget: int, prefix_rows: torch.Tensor, correct: torch.Tensor | None = None
    ) -> None:
        """``prefix_rows`` (groups, budget, budget): the attention rows of the first ``budget`` positions;
        ``correct`` (length,): each row's teacher-forced correctness, for ``RMMPress(correctness="teacher_forced")``,
        which reads it from its transcript (``_arrive``)."""
        self.press, self.budget, self.correct = press, budget, correct
        groups = prefix_rows.shape[0]
        self.held = torch.arange(budget).expand(groups, -1)
        if correct is not None:
            transcript = press._transcript  # what the model's hooks fill, filled here from the trace
            transcript.tokens = torch.full((1, len(correct)), -1)
            transcript.predictions = torch.full((1, len(correct)), -1)
            transcript.extent = None  # no host record: the press reads the tables
        press.compression_ratio = 0.0
        self._compress(prefix_rows, torch.arange(budget))

    def step(self, position: int, row: torch.Tensor) -> torch.Tensor:
        """Admit ``position`` with its row of attention (groups, held + 1) over the held positions (in ascending
        order) and itself; the press evicts to the budget. Returns the held positions (groups, <= budget)."""
        self.held = torch.cat([self.held, torch.full((self.held.shape[0], 1), position)], dim=1)
        self.press.compression_ratio = Budget("tokens", self.budget).compression_ratio(self.held.shape[1])
        self._compress(row[:, None], torch.tensor([position]))
        return self.held

    def _arrive(self, positions: torch.Tensor) -> None:
        """Record in the press's transcript the tokens at ``positions`` and their rows' predictions, as the model's
        hooks do when they run: position t's token is written as t, its prediction as t + 1 where the trace's row t
        is correct and as t where it is not, so the weight of row t settles once position t + 1 arrives."""
        if self.correct is not None:
            transcript = self.press._transcript
            transcript.tokens[0, positions] = positions
            transcript.predictions[0, positions] = positions + self.correct[positions].long()

    def _compress(self, rows: torch.Tensor, positions: torch.Tensor) -> None:
        self._arrive(positions)
        n_rows, length = rows.shape[1], self.held.shape[1]
        keys = self.held[None, :, :, None].float()
        kwargs = {
            "hidden_states": torch.zeros(1, n_rows, 1),
            "cache_position": torch.arange(length - n_rows, length),
            "position_ids": positions[None],
        }
        kept, _ = self.press.compress(LAYER, kwargs["hidden_states"], keys, keys, rows[None].float(), kwargs)
        self.held = kept[0, :, :, 0].long()
