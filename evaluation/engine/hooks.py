"""A press's own forward hook, run on one layer's stored prefill inputs instead of inside a forward.

KVPress calls a prefill press's ``forward_hook(module, input, kwargs, output)`` after each attention layer.
``run_hook`` calls it the same way, with the layer's stored input rows, rotary embeddings and keys and values
(copies on write: ThinK edits keys in place), on a stand-in cache of that layer, so the press's code alone
decides what the layer keeps. The column sums the history keeps are handed, for the call, to the presses that
read them (``presses.column_sums.ColumnSumReader``: ``sums_handed``), and H2O's stand in for the eager weights
``ObservedAttentionPress`` reads (``attentions``, one row). What a press leaves on the module for decoding
(``masked_key_indices``: AdaKV's head-wise eviction, which KVPress applies during attention) is read back as a
mask and the module restored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from kvpress.presses.base_press import BasePress
from kvpress.presses.scorer_press import ScorerPress
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from presses.harness import ColumnSumReader, ColumnSums, every_press

MASKED = "masked_key_indices"


@dataclass
class Compressed:
    """A press's cache of one sequence: per layer its keys and values, and ``masks`` (batch, num_kv_heads, length)
    True where a key stays in memory but no query may attend to it (None: every key is visible). ``kept_tokens``:
    the keys a query may attend to, per layer and KV head on average (PyramidKV keeps a different number in each
    layer, AdaKV in each head), the budget every press is held to. ``owned``: False for a cache someone else still
    extends (the history's own, as the full cache), which a batch that takes over its caches must copy."""

    cache: DynamicCache
    masks: list[torch.Tensor | None]
    owned: bool = True
    kept_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.kept_tokens = kept_tokens(self.cache, self.masks)


def kept_tokens(cache: DynamicCache, masks: list[torch.Tensor | None]) -> int:
    visible = [
        layer.keys.shape[2] - (0 if mask is None else mask.sum(-1).float().mean().item())
        for layer, mask in zip(cache.layers, masks, strict=True)
    ]
    return round(sum(visible) / len(visible))


@contextmanager
def no_new_hooks(model: nn.Module) -> Iterator[None]:
    """The hooks registered on ``model``'s modules inside the block are removed when it exits."""
    modules = list(model.modules())
    before = [(set(m._forward_hooks), set(m._forward_pre_hooks)) for m in modules]
    try:
        yield
    finally:
        for module, (hooks, pre_hooks) in zip(modules, before, strict=True):
            for key in set(module._forward_hooks) - hooks:
                del module._forward_hooks[key]
                module._forward_hooks_with_kwargs.pop(key, None)
            for key in set(module._forward_pre_hooks) - pre_hooks:
                del module._forward_pre_hooks[key]
                module._forward_pre_hooks_with_kwargs.pop(key, None)


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
    kwargs = hook_kwargs(module, keys, values, hidden_states, rotary)
    with on_module(module), sums_handed(press, module.layer_idx, sums):
        press.forward_hook(module, [], kwargs, (None, attentions))
        layer = kwargs["past_key_values"].layers[module.layer_idx]
        return layer.keys, layer.values, mask_of(getattr(module, MASKED, None), layer.keys)


def run_score(
    press: ScorerPress,
    module: nn.Module,
    keys: torch.Tensor,
    values: torch.Tensor,
    hidden_states: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor],
    attentions: torch.Tensor | None,
    sums: dict[ColumnSums, torch.Tensor],
) -> torch.Tensor:
    """The scorer's own ``score`` of every cached position of ``module``'s layer, (batch, num_kv_heads, length),
    from the same inputs ``run_hook`` hands its forward hook."""
    kwargs = hook_kwargs(module, keys, values, hidden_states, rotary)
    with on_module(module), sums_handed(press, module.layer_idx, sums):
        return press.score(module, hidden_states, keys, values, attentions, kwargs)


@contextmanager
def sums_handed(press: BasePress, layer_idx: int, sums: dict[ColumnSums, torch.Tensor]) -> Iterator[None]:
    """Inside the block, the sums of each statistic at the layer ``layer_idx`` are handed to the first press that
    reads them, ``press`` or one it holds (depth first, the order its hooks run in): one prefill's sums, read once,
    as a later reader of the same statistic would find them taken and recompute its own."""
    remaining, readers = dict(sums), []
    for held in every_press(press):
        if isinstance(held, ColumnSumReader) and held.statistic in remaining:
            held.hand_column_sums(layer_idx, remaining.pop(held.statistic))
            readers.append(held)
    try:
        yield
    finally:
        for reader in readers:
            reader.hand_column_sums(layer_idx, None)


def hook_kwargs(
    module: nn.Module,
    keys: torch.Tensor,
    values: torch.Tensor,
    hidden_states: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor],
) -> dict:
    """The keyword arguments a prefill of ``hidden_states`` passes ``module``'s forward hook, with a stand-in
    cache holding a copy-on-write copy of the layer's keys and values: a press that edits them in place (ThinK)
    edits its own copy, and the others copy nothing."""
    positions = torch.arange(keys.shape[2], device=keys.device)
    return {
        "hidden_states": hidden_states,
        "attention_mask": None,
        "position_ids": positions[None],
        "past_key_values": cache_of([*[(keys, values)] * module.layer_idx, (lazy_copy(keys), lazy_copy(values))]),
        "use_cache": True,
        "cache_position": positions,
        "position_embeddings": rotary,
    }


def lazy_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` that shares its memory until either is written to (torch's copy-on-write clone)."""
    return torch._lazy_clone(tensor)


@contextmanager
def on_module(module: nn.Module) -> Iterator[None]:
    """Whatever a press sets on ``module`` inside the block is removed, and what it changed restored."""
    saved = dict(vars(module))
    try:
        yield
    finally:
        for name in set(vars(module)) - set(saved):
            delattr(module, name)
        vars(module).update(saved)
