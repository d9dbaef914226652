"""A press's own forward hook, run on one layer's stored prefill inputs instead of inside a forward.

KVPress calls a prefill press's ``forward_hook(module, input, kwargs, output)`` after each attention layer.
``run_hook`` calls it the same way, with the layer's stored input rows, rotary embeddings and keys and values
(a copy: some presses edit keys in place), on a stand-in cache of that layer, so the press's code alone decides
what the layer keeps. What a press leaves on the module for decoding (``masked_key_indices``: AdaKV's
head-wise eviction, which KVPress applies during attention) is read back as a mask and the module restored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpress.presses.base_press import BasePress
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from presses.column_sums import ColumnSums, provide

MASKED = "masked_key_indices"


@dataclass
class Compressed:
    """A press's cache of one sequence: per layer its keys and values, and ``masks`` (batch, num_kv_heads, length)
    True where a key stays in memory but no query may attend to it (None: every key is visible)."""

    cache: DynamicCache
    masks: list[torch.Tensor | None]

    @property
    def kept_tokens(self) -> int:
        """The keys a query may attend to, per layer and KV head on average (PyramidKV keeps a different number
        in each layer, AdaKV in each head): the budget every press is held to."""
        return kept_tokens(self.cache, self.masks)


def kept_tokens(cache: DynamicCache, masks: list[torch.Tensor | None]) -> int:
    visible = [
        layer.keys.shape[2] - (0 if mask is None else mask.sum(-1).float().mean().item())
        for layer, mask in zip(cache.layers, masks, strict=True)
    ]
    return round(sum(visible) / len(visible))


def cache_of(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A cache holding these keys and values (batch, num_kv_heads, length, head_dim) per layer, without copies."""
    cache = DynamicCache()
    cache.layers = []
    for keys, values in layers:
        layer = DynamicLayer()
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        cache.layers.append(layer)
    return cache


def mask_of(indices: tuple[torch.Tensor, ...] | None, keys: torch.Tensor) -> torch.Tensor | None:
    """KVPress's ``masked_key_indices`` (batch, head and position indices) as a boolean mask like ``keys[..., 0]``."""
    if indices is None:
        return None
    mask = torch.zeros(keys.shape[:3], dtype=torch.bool, device=keys.device)
    mask[tuple(index.to(keys.device) for index in indices)] = True
    return mask


def run_hook(
    press: BasePress,
    module: nn.Module,
    keys: torch.Tensor,
    values: torch.Tensor,
    hidden_states: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor],
    attentions: torch.Tensor | None,
    sums: dict[ColumnSums, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The keys, values and mask the press leaves for ``module``'s layer after a prefill of ``hidden_states``
    (batch, length, hidden) whose full keys and values these are, as under sdpa (``attentions`` None) or with
    H2O's sums standing in for the eager weights; ``sums``: the column sums handed to presses that read them."""
    length = keys.shape[2]
    positions = torch.arange(length, device=keys.device)
    stand_in = cache_of([*[(keys, values)] * module.layer_idx, (keys.clone(), values.clone())])
    kwargs = {
        "hidden_states": hidden_states,
        "attention_mask": None,
        "position_ids": positions[None],
        "past_key_values": stand_in,
        "use_cache": True,
        "cache_position": positions,
        "position_embeddings": rotary,
    }
    saved = dict(vars(module))
    try:
        with provide(module, sums):
            press.forward_hook(module, [], kwargs, (None, attentions))
        layer = stand_in.layers[module.layer_idx]
        return layer.keys, layer.values, mask_of(getattr(module, MASKED, None), layer.keys)
    finally:
        for name in set(vars(module)) - set(saved):
            delattr(module, name)
        vars(module).update(saved)
