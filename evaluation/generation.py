"""Greedy generation from a press-compressed cache (the per-cell reference path)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from kvpress.presses.base_press import BasePress
from transformers import DynamicCache, PreTrainedModel


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    kept_tokens: int  # cache length of layer 0 right after the compressed prefill


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    context_ids: torch.Tensor,
    question_ids: torch.Tensor,
    press: BasePress | None,
    max_new_tokens: int,
    stop_ids: set[int],
) -> Generation:
    """Prefill ``context_ids`` under ``press``, append ``question_ids`` uncompressed, then decode greedily.

    Positions continue after the full context length, whatever the press kept (as in KVPress's pipeline).
    Stops after a token in ``stop_ids`` (not included) or ``max_new_tokens`` tokens.
    """
    device = model.device
    cache = DynamicCache()
    with press(model) if press is not None else nullcontext():
        outputs = model(input_ids=context_ids.to(device), past_key_values=cache, logits_to_keep=1)
    kept_tokens = cache.get_seq_length()
    position = context_ids.shape[1]
    if question_ids.shape[1]:
        positions = torch.arange(position, position + question_ids.shape[1], device=device).unsqueeze(0)
        outputs = model(
            input_ids=question_ids.to(device), past_key_values=cache, position_ids=positions, logits_to_keep=1
        )
        position += question_ids.shape[1]
    generated: list[int] = []
    for _ in range(max_new_tokens):
        token = int(outputs.logits[0, -1].argmax())
        if token in stop_ids:
            break
        generated.append(token)
        outputs = model(
            input_ids=torch.tensor([[token]], device=device),
            past_key_values=cache,
            position_ids=torch.tensor([[position]], device=device),
        )
        position += 1
    return Generation(generated, kept_tokens)


def eos_ids(model: PreTrainedModel) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set(eos) if isinstance(eos, list) else {eos} if eos is not None else set()
