"""Where a scorer ranks a probe's sixteen facts, and whether both gold facts land in its top k.

A scorer gives every cached position a score per layer and KV head (a press's own ``score``, through the engine);
a fact's score is that score averaged over the fact's tokens, the layers and the KV heads. ``recency`` ranks the
facts by position alone, the newest first. A gold fact's rank counts every other fact scored at least as high, so a
tie never helps a scorer.
"""

from __future__ import annotations

import torch

KS = (2, 4)


def fact_scores(layer_scores: list[torch.Tensor], spans: list[tuple[int, int]]) -> list[float]:
    """Each span's mean score; ``layer_scores``: per layer (1, num_kv_heads, length) scores of every position."""
    per_position = torch.stack([scores[0].float().mean(0) for scores in layer_scores]).mean(0)
    return [float(per_position[start:stop].mean()) for start, stop in spans]


def recency_scores(spans: list[tuple[int, int]]) -> list[float]:
    return [float(start) for start, _ in spans]


def gold_ranks(scores: list[float], gold: tuple[int, ...]) -> list[int]:
    """Each gold fact's rank, 1 the highest: one plus the number of other facts scored at least as high."""
    return [1 + sum(s >= scores[g] for j, s in enumerate(scores) if j != g) for g in gold]


def both_in_top(ranks: list[int], k: int) -> bool:
    return max(ranks) <= k
