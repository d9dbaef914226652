"""Token F1 on the multiset overlap, shared by the LongBench and LoCoMo rules."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def token_f1(prediction_tokens: Sequence[str], gold_tokens: Sequence[str]) -> float:
    """F1 of the multiset overlap of two token lists (0 when nothing overlaps)."""
    overlap = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(prediction_tokens), overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)
