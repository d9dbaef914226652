"""Column sums of a layer's attention: what H2O's and RMM's scores read of the attention weights.

A press that scores cached positions by ``sum over rows t of w(t) a(t -> k)`` reads nothing else of the
(length x length) attention matrix, and the sum adds up over query rows: chunk by chunk, and turn by turn as a
history grows. ``ColumnSums`` names one such statistic; ``add_column_sums`` adds a chunk of rows to it. A press
that reads a statistic (``ColumnSumReader``) takes the sums from whoever computed them elsewhere (the fused
attention of its own prefill, a caller's shared prefill) through ``hand_column_sums``, and still decides, with its
own code, what it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

CORRECTNESS = ("uniform", "teacher_forced", "confidence", "random", "supplied")


@dataclass(frozen=True)
class ColumnSums:
    """``sum over rows t of w(t) a(t -> k)`` per query head: over every row t >= k (``lag=None``, H2O's sums,
    the diagonal included) or over Eq. 1's window k < t <= k + lag; w(t) is 1 (``uniform``), the model's
    teacher-forced correctness (``teacher_forced``), the probability of its top-1 prediction at t
    (``confidence``), the random control drawn with ``seed`` (``random``, ``presses.random_weights``) or weights a
    caller supplied (``supplied``)."""

    lag: int | None = None
    correctness: str = "uniform"
    seed: int | None = None  # the random control's only

    def __post_init__(self) -> None:
        if self.correctness not in CORRECTNESS:
            raise ValueError(f"correctness must be one of {CORRECTNESS}, got {self.correctness!r}")
        if (self.seed is None) != (self.correctness != "random"):
            raise ValueError(f"a seed goes with correctness='random' and only with it, got {self!r}")

    @property
    def weighting(self) -> str:
        """The row weights the sums read, by name: the correctness mode, and the random control's seed."""
        return self.correctness if self.seed is None else f"{self.correctness}(seed={self.seed})"


H2O_SUMS = ColumnSums()


def in_window(rows: torch.Tensor, slots: torch.Tensor, lag: int | None) -> torch.Tensor:
    """Whether row t counts towards the slot at position t_k: (..., n_rows, n_slots) booleans.

    ``rows`` (..., n_rows) and ``slots`` (..., n_slots) are absolute positions with broadcastable leading axes.
    A finite lag: t_k < t <= t_k + lag (Eq. 1). ``None``: t >= t_k.
    """
    distance = rows[..., :, None] - slots[..., None, :]
    if lag is None:
        return distance >= 0
    return (distance > 0) & (distance <= lag)


def add_column_sums(
    sums: torch.Tensor, probs: torch.Tensor, rows: torch.Tensor, lag: int | None, weights: torch.Tensor | None
) -> None:
    """Add a chunk of attention rows to ``sums`` (batch, num_heads, k_len), in place.

    ``probs`` (batch, num_heads, chunk, visible): float32 attention of the rows at absolute positions ``rows``
    (chunk,) over the first ``visible`` positions; ``weights`` (batch, chunk): w(t) of those rows, or None for
    all ones.
    """
    visible = probs.shape[-1]
    if lag is not None:
        probs = probs * in_window(rows, torch.arange(visible, device=probs.device), lag)
    if weights is not None:
        probs = probs * weights[:, None, :, None].to(probs.device, torch.float32)
    sums[..., :visible] += probs.sum(2)


@runtime_checkable
class ColumnSumReader(Protocol):
    """A press whose prefill score reads a layer's attention only through the column sums of ``statistic``, and
    takes them precomputed when they are handed to it instead of recomputing them."""

    @property
    def statistic(self) -> ColumnSums:
        """The column sums of a prefill's attention the press reads."""
        ...

    def hand_column_sums(self, layer_idx: int, sums: torch.Tensor | None) -> None:
        """Hand the press the sums of ``statistic`` (batch, num_heads, k_len) over a prefill of the layer
        ``layer_idx`` that has yet to reach the press's hook (None: take back what was handed). The press reads
        them in its next prefill of that layer over k_len keys, once, and recomputes the sums when handed none."""
        ...
