"""A forward that keeps each layer's attention input, and the token ids a cache was built from.

A press that scores from attention rows needs each layer's input for the rows it scores. ``forward_capturing``
runs the decoder stack and keeps them (the evaluation engine's one prefill, the eviction lab's traces, RMM's
replay of a prefix). KVPress's pipeline prefills outside a ``DecodingPress`` context, so the press inside it
first meets a cache it never saw being built; layer 0's values are a function of the token alone (no position,
no earlier token), so ``token_ids_of`` reads the ids back from them, and a replay of those ids gives every
layer's input exactly as the prefill computed it.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from presses.model_hooks import hooks_suspended, language_model

VOCABULARY_CHUNK = 4096  # vocabulary rows whose layer-0 values are compared at a time

LayerInput = tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]  # hidden states, rotary (cos, sin)


@torch.no_grad()
def forward_capturing(
    model: PreTrainedModel, ids: torch.Tensor, cache: DynamicCache | None, start: int
) -> tuple[torch.Tensor, dict[int, LayerInput]]:
    """Run the decoder stack over ``ids`` (batch, n) at positions ``start`` onwards (extending ``cache``, if
    any); returns the final hidden states and, per layer index, the attention layer's input and rotary
    embeddings."""
    captured: dict[int, LayerInput] = {}

    def capture(module, args, kwargs, output):
        captured[module.layer_idx] = (kwargs["hidden_states"], kwargs["position_embeddings"])

    stack = language_model(model)
    hooks = [layer.self_attn.register_forward_hook(capture, with_kwargs=True) for layer in stack.layers]
    try:
        positions = torch.arange(start, start + ids.shape[1], device=ids.device).unsqueeze(0)
        hidden = stack(input_ids=ids, past_key_values=cache, position_ids=positions, use_cache=cache is not None)[0]
    finally:
        for hook in hooks:
            hook.remove()
    return hidden, captured


@torch.no_grad()
def token_ids_of(model: PreTrainedModel, values: torch.Tensor) -> torch.Tensor:
    """The token ids (batch, n) whose layer-0 values are ``values`` (batch, num_kv_heads, n, head_dim): for each
    position, the vocabulary entry with the nearest layer-0 value."""
    layer = language_model(model).layers[0]
    embeddings = model.get_input_embeddings().weight
    wanted = values.transpose(1, 2).flatten(2).float()  # (batch, n, num_kv_heads * head_dim)
    best = torch.full(wanted.shape[:2], float("inf"), device=values.device)
    ids = torch.zeros(wanted.shape[:2], dtype=torch.long, device=values.device)
    for start in range(0, embeddings.shape[0], VOCABULARY_CHUNK):
        rows = embeddings[start : start + VOCABULARY_CHUNK]
        candidates = layer.self_attn.v_proj(layer.input_layernorm(rows[None]))[0].float().to(values.device)
        distance, index = torch.cdist(wanted, candidates[None].expand(wanted.shape[0], -1, -1)).min(-1)
        closer = distance < best
        best, ids = torch.where(closer, distance, best), torch.where(closer, index + start, ids)
    return ids


@torch.no_grad()
def replay(model: PreTrainedModel, ids: torch.Tensor) -> tuple[dict[int, LayerInput], torch.Tensor]:
    """Every layer's input for ``ids`` (batch, n) at positions 0..n-1, and the final hidden states (batch, n,
    hidden) whose logits predict each row's next token, from one forward with every hook of the model suspended
    (nothing compresses or records)."""
    with hooks_suspended(model):
        hidden, captured = forward_capturing(model, ids, None, 0)
    return captured, hidden
