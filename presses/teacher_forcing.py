"""Teacher-forced correctness of a causal LM's predictions, and the hooks that let a press read it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers import PreTrainedModel

LOGIT_CHUNK_SIZE = 512


def language_model(model: PreTrainedModel) -> nn.Module:
    """The decoder stack of a causal LM (the module whose output is the final normed hidden state)."""
    return model.model.language_model if hasattr(model.model, "language_model") else model.model


@torch.no_grad()
def teacher_forced_correctness(
    lm_head: nn.Module,
    hidden_states: torch.Tensor,
    input_ids: torch.Tensor,
    chunk_size: int = LOGIT_CHUNK_SIZE,
) -> torch.Tensor:
    """1.0 where the top-1 prediction at row t equals token t + 1, else 0.0; the last row weighs 1.0.

    ``hidden_states`` (batch, length, hidden) are the decoder's final (normed) outputs; the logits are
    computed ``chunk_size`` rows at a time, so a (length x vocabulary) matrix is never held.
    Returns shape (batch, length).
    """
    batch, length = input_ids.shape
    correct = torch.ones(batch, length, dtype=torch.float32, device=input_ids.device)
    for start in range(0, length - 1, chunk_size):
        stop = min(start + chunk_size, length - 1)
        predicted = lm_head(hidden_states[:, start:stop]).argmax(-1)
        correct[:, start:stop] = (predicted == input_ids[:, start + 1 : stop + 1]).float()
    return correct


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
