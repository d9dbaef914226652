"""How far each cell's kept set agrees with the reference press's at the same budget on the same input.

The Jaccard index of two kept sets, per layer and KV head: the positions both hold over the positions either holds
(``retention.held_positions``: a masked key is not held). A row keeps, per layer, its mean and its minimum over the
KV heads (``OVERLAP_FIELDS``); a cell whose kept positions are unknown (its own prefill, keys that are no copies),
or that has no reference cell beside it, keeps None.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypedDict

import torch

DIGITS = 4  # a Jaccard index as a row stores it


class Overlap(TypedDict):
    overlap_with_reference: list[float] | None  # per layer: the mean over KV heads of the Jaccard index
    overlap_min_head: list[float] | None  # per layer: the least Jaccard index of a KV head


OVERLAP_FIELDS = tuple(Overlap.__annotations__)
UNKNOWN: Overlap = dict.fromkeys(OVERLAP_FIELDS)  # type: ignore[assignment]


def jaccard(held: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """(..., length) boolean kept sets -> (...) their Jaccard index in float64; two empty sets agree (1)."""
    both = (held & reference).sum(-1, dtype=torch.float64)
    either = (held | reference).sum(-1, dtype=torch.float64)
    return torch.where(either > 0, both / either.clamp(min=1), torch.ones_like(either))


def layer_overlap(held: list[torch.Tensor], reference: list[torch.Tensor]) -> Overlap:
    """Per layer, the mean and the minimum over (batch, KV head) of the two kept sets' Jaccard index."""
    indices = [jaccard(mine, theirs).flatten() for mine, theirs in zip(held, reference, strict=True)]
    return {
        "overlap_with_reference": [round(index.mean().item(), DIGITS) for index in indices],
        "overlap_min_head": [round(index.min().item(), DIGITS) for index in indices],
    }


def overlaps(
    cells: Sequence[tuple[str, Hashable]], held: Sequence[list[torch.Tensor] | None], reference: str
) -> list[Overlap]:
    """Each (press, budget) cell's overlap with the ``reference`` press's cell at its budget, from every cell's
    held positions (``retention.held_positions``, None where unknown)."""
    references = {budget: kept for (press, budget), kept in zip(cells, held, strict=True) if press == reference}
    found = [(kept, references.get(budget)) for (_, budget), kept in zip(cells, held, strict=True)]
    return [UNKNOWN if mine is None or theirs is None else layer_overlap(mine, theirs) for mine, theirs in found]
