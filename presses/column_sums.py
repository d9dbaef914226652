"""Column sums of a layer's attention: what H2O's and RMM's scores read of the attention weights.

A press that scores cached positions by ``sum over rows t of w(t) a(t -> k)`` reads nothing else of the
(length x length) attention matrix, and the sum adds up over query rows: chunk by chunk, and turn by turn as a
history grows. ``ColumnSums`` names one such statistic; ``add_column_sums`` adds a chunk of rows to it. Whoever
computes the sums elsewhere (``presses.fused_attention`` inside the attention kernel, the evaluation engine from
one shared prefill) hands them to the press through the attention module (``provide`` / ``provided``), so the
press still decides, with its own code, what it keeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

CORRECTNESS = ("uniform", "teacher_forced", "confidence", "supplied")
PROVIDED = "kvet_column_sums"  # the attention module's attribute: {ColumnSums: sums (batch, num_heads, k_len)}


@dataclass(frozen=True)
class ColumnSums:
    """``sum over rows t of w(t) a(t -> k)`` per query head: over every row t >= k (``lag=None``, H2O's sums,
    the diagonal included) or over Eq. 1's window k < t <= k + lag; w(t) is 1 (``uniform``), the model's
    teacher-forced correctness (``teacher_forced``), the probability of its top-1 prediction at t
    (``confidence``) or weights a caller supplied (``supplied``)."""

    lag: int | None = None
    correctness: str = "uniform"

    def __post_init__(self) -> None:
        if self.correctness not in CORRECTNESS:
            raise ValueError(f"correctness must be one of {CORRECTNESS}, got {self.correctness!r}")


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


@contextmanager
def provide(module: nn.Module, sums: dict[ColumnSums, torch.Tensor]) -> Iterator[None]:
    """Inside the block, ``module`` hands ``sums`` to the presses that read them (``provided``)."""
    setattr(module, PROVIDED, dict(sums))
    try:
        yield
    finally:
        delattr(module, PROVIDED)


def provided(module: nn.Module, statistic: ColumnSums, k_len: int) -> torch.Tensor | None:
    """The sums of ``statistic`` over ``k_len`` keys that ``module`` was handed, removed from it; None if none."""
    table: dict[ColumnSums, torch.Tensor] = getattr(module, PROVIDED, {})
    sums = table.get(statistic)
    if sums is None or sums.shape[-1] != k_len:
        return None
    return table.pop(statistic)
