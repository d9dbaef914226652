"""Which positions of the history a press's cache still holds, read from the kept keys themselves.

A press's ``compress`` returns gathered keys, not their positions. A gathered key is a bitwise copy of the
history's key at its position, so an exact fingerprint of its bits finds that position. A press that changes the
keys it keeps (``KeyRerotationPress``) has no such copy: its retention is unknown.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from evaluation.engine.hooks import Compressed

RETAINED = "answer held (%), "  # the scorecard's conditions of retention, as a share of slots
INTEGER_VIEW = {4: torch.int32, 2: torch.int16}  # a key element's bytes -> the integer type that holds its bits


def fingerprints(keys: torch.Tensor) -> torch.Tensor:
    """(..., length): an integer of each key's exact bits (wrapping int64 arithmetic, the same on every device)."""
    bits = keys.contiguous().view(INTEGER_VIEW[keys.element_size()]).to(torch.int64)
    generator = torch.Generator().manual_seed(0)
    weights = torch.randint(-(2**62), 2**62, (keys.shape[-1],), generator=generator, dtype=torch.int64)
    return (bits * weights.to(keys.device)).sum(-1)


def kept_positions(full: torch.Tensor, kept: torch.Tensor) -> torch.Tensor | None:
    """The history position of each kept key, (batch, num_kv_heads, kept); None if some kept key is no copy of a
    history key."""
    reference, found = fingerprints(full), fingerprints(kept)
    order = reference.argsort(-1)
    ordered = reference.gather(-1, order)
    slots = torch.searchsorted(ordered, found).clamp(max=ordered.shape[-1] - 1)
    if not torch.equal(ordered.gather(-1, slots), found):
        return None
    return order.gather(-1, slots)


def answer_spans(token_ids: list[int], answer_ids: list[int]) -> list[list[int]]:
    """The positions of every copy of ``answer_ids`` in ``token_ids``."""
    width = len(answer_ids)
    return [
        list(range(start, start + width))
        for start in range(len(token_ids) - width + 1)
        if token_ids[start : start + width] == answer_ids
    ]


def held_positions(history: DynamicCache, compressed: Compressed) -> list[torch.Tensor] | None:
    """Per layer, (batch, num_kv_heads, length) True at each history position the press's cache holds visibly (a
    masked key is held but never seen); None when the cache's keys are not copies of the history's."""
    if not compressed.owned:  # the history's own cache: everything is held
        return [torch.ones(full.keys.shape[:3], dtype=torch.bool, device=full.keys.device) for full in history.layers]
    held = []
    for layer, full, mask in zip(compressed.cache.layers, history.layers, compressed.masks, strict=True):
        positions = kept_positions(full.keys, layer.keys)
        if positions is None:
            return None
        length = full.keys.shape[2]
        if mask is not None:  # a masked key goes to a slot past the history
            positions = positions.masked_fill(mask, length)
        present = torch.zeros(*positions.shape[:2], length + 1, dtype=torch.bool, device=positions.device)
        held.append(present.scatter(-1, positions, True)[..., :length])
    return held


def retention(history: DynamicCache, compressed: Compressed, spans: list[list[int]]) -> float | None:
    """The share of (layer, KV head) slots in which every position of at least one span is in the cache and
    visible; None with no span, or when the cache's keys are not copies of the history's."""
    if not spans:
        return None
    if not compressed.owned:
        return 1.0
    layers = held_positions(history, compressed)
    if layers is None:
        return None
    held = []
    for present in layers:
        copies = torch.stack([present[..., span].all(-1) for span in spans], -1)
        held.append(copies.any(-1).float().mean().item())
    return sum(held) / len(held)
