"""Hooks on a model that live as long as a press's: what a press needs to watch the model it compresses.

KVPress attaches a press's hooks to the attention layers when its context manager is entered and removes them when
it exits, and tells a press held by a wrapper nothing of either. ``WrapperBound`` ties hooks of a press's own (on
the decoder stack, its final norm) to the attention hooks of whichever press runs it, so that they go with them.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from kvpress.presses.base_press import BasePress
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers import PreTrainedModel

from presses.wrapped import every_press


def language_model(model: PreTrainedModel) -> nn.Module:
    """The decoder stack of a causal LM (the module whose output is the final normed hidden state)."""
    return model.model.language_model if hasattr(model.model, "language_model") else model.model


@contextmanager
def hooks_suspended(model: nn.Module) -> Iterator[None]:
    """Run ``model`` with every forward hook and pre-hook of its modules switched off, then restore them.

    Used for a pre-pass inside another press's hooks, which must neither compress nor record anything.
    """
    saved = [(module, module._forward_hooks, module._forward_pre_hooks) for module in model.modules()]
    try:
        for module, _, _ in saved:
            module._forward_hooks, module._forward_pre_hooks = OrderedDict(), OrderedDict()
        yield
    finally:
        for module, hooks, pre_hooks in saved:
            module._forward_hooks, module._forward_pre_hooks = hooks, pre_hooks


def input_ids_of(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The ``input_ids`` a decoder stack was called with (None when it was given ``inputs_embeds``)."""
    return kwargs.get("input_ids", args[0] if args else None)


class WrapperBound:
    """Hooks on the model whose lifetime is the attention hooks of the press that runs ``owner`` (itself or a
    wrapper holding it): ``_bind_to_wrapper`` ties them on their first call, and once those hooks are removed (the
    press's context exits), these are removed too."""

    def __init__(self) -> None:
        self.handles: list[RemovableHandle] = []
        self._bound: list[weakref.finalize] = []

    @property
    def attached(self) -> bool:
        return bool(self.handles)

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        for bound in self._bound:
            bound.detach()
        self.handles, self._bound = [], []

    def _bind_to_wrapper(self, model: PreTrainedModel, owner: object) -> bool:
        """Tie the hooks' lifetime to the wrapper's attention hooks; False (and detach) when none is left."""
        if self._bound:
            return True
        attention = language_model(model).layers[0].self_attn
        holders = [(hook, getattr(hook, "__self__", None)) for hook in attention._forward_hooks.values()]
        hooks = [
            hook
            for hook, holder in holders
            if isinstance(holder, BasePress) and any(press is owner for press in every_press(holder))
        ]
        if not hooks:
            self.detach()
            return False
        self._bound = [weakref.finalize(hook, self.detach) for hook in hooks]
        return True
