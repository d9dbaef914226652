"""Key fingerprints: a cached key's projection on a few fixed random directions, which finds its slot again.

An eviction never changes a kept key, so its fingerprint, taken when the key was cached, still matches it after
any press evicted others: TOVA finds the survivors of an earlier press of a ``ComposedPress`` among the keys it
scored, and RMM's smoother finds its slots in a cache another press compressed (``nearest_slots``).
"""

from __future__ import annotations

from functools import cache

import torch

MARK_DIMS = 8  # a key's fingerprint: its projection on this many fixed random directions
SAME_KEY = 1e-3  # two fingerprints within this relative L1 distance are one key (rounding, a quantized cache)
SEARCH_CHUNK = 1024  # fingerprints matched at a time by the exhaustive search


@cache
def _directions(head_dim: int, device: torch.device) -> torch.Tensor:
    """The fingerprints' random directions, made on the CPU and copied to ``device`` once (a copy from the host's
    memory makes the host wait for the device)."""
    return torch.randn(head_dim, MARK_DIMS, generator=torch.Generator().manual_seed(0)).to(device)


def key_marks(keys: torch.Tensor) -> torch.Tensor:
    """Fingerprints of keys (batch, num_kv_heads, n, head_dim): (batch, num_kv_heads, n, MARK_DIMS) float32. A
    kept key is never changed by an eviction, so its fingerprint finds its slot again."""
    return keys.float() @ _directions(keys.shape[-1], keys.device)


def nearest_slots(slot_marks: torch.Tensor, marks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each fingerprint of ``marks`` (batch, num_kv_heads, m, MARK_DIMS), the slot of ``slot_marks`` (batch,
    num_kv_heads, n, MARK_DIMS) with the nearest one, and whether it is the same key: (batch, num_kv_heads, m)
    indices and booleans. Neighbours in the order of the first dimension first; an exhaustive search for the
    fingerprints they do not match."""
    n = slot_marks.shape[-2]
    order = slot_marks[..., 0].argsort(dim=-1)
    ranked = slot_marks.gather(-2, order[..., None].expand(-1, -1, -1, MARK_DIMS))
    place = torch.searchsorted(ranked[..., 0].contiguous(), marks[..., 0].contiguous())
    candidates = (place[..., None] + torch.arange(-2, 3, device=place.device)).clamp(0, n - 1)
    near = ranked.gather(-2, candidates.flatten(-2)[..., None].expand(-1, -1, -1, MARK_DIMS))
    distance = (near.unflatten(-2, candidates.shape[-2:]) - marks[..., None, :]).abs().sum(-1)
    closest, pick = distance.min(-1)
    index = order.gather(-1, candidates.gather(-1, pick[..., None])[..., 0])
    scale = marks.abs().sum(-1).clamp(min=1e-12)
    if not bool((closest <= SAME_KEY * scale).all()):
        for start in range(0, marks.shape[-2], SEARCH_CHUNK):
            chunk = slice(start, start + SEARCH_CHUNK)
            exhaustive, found = torch.cdist(marks[..., chunk, :], slot_marks, p=1).min(-1)
            better = exhaustive < closest[..., chunk]
            closest[..., chunk] = torch.where(better, exhaustive, closest[..., chunk])
            index[..., chunk] = torch.where(better, found, index[..., chunk])
    return index, closest <= SAME_KEY * scale
