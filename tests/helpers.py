"""Test helpers: tiny random models built in code, and the kept positions of a prefill press."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from kvpress import KnormPress
from kvpress.presses.base_press import BasePress
from transformers import (
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from evaluation.runs.data_location import shared_data
from evaluation.runs.models import BYTE_CHAT_TEMPLATE, byte_tokenizer

SHARED_DATA = shared_data()
TINY = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
}


def tiny_model(
    arch: str,
    attn_implementation: str,
    hidden_size: int = 64,
    vocab_size: int = 256,
    context: int = 1024,
    **settings: object,
) -> PreTrainedModel:
    """A 2-layer random model with grouped-query attention (4 query heads, 2 KV heads), same weights per seed;
    ``settings``: more config fields (a sliding window, say)."""
    config_class, model_class = TINY[arch]
    config = config_class(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        eos_token_id=2,
        pad_token_id=2,
        bos_token_id=1,
        **settings,
    )
    torch.manual_seed(0)
    model = model_class(config).eval()
    model.set_attn_implementation(attn_implementation)
    return model


@torch.no_grad()
def confident_model(
    arch: str, attn_implementation: str, sharpness: float = 20.0, **settings: object
) -> PreTrainedModel:
    """``tiny_model`` with its output head scaled by ``sharpness``: peaked logits, whose top-1 probabilities spread
    over about (0.1, 0.9) where a random head's stay near 1 / vocabulary. The attention is the tiny model's."""
    model = tiny_model(arch, attn_implementation, **settings)
    model.get_output_embeddings().weight.mul_(sharpness)
    return model


@torch.no_grad()
def confidence_weights(model: PreTrainedModel, input_ids: torch.Tensor) -> torch.Tensor:
    """The probability of the top-1 prediction at every row, the max of the softmax of a plain forward's logits
    in float32: (batch, length)."""
    return model(input_ids=input_ids).logits.float().softmax(-1).amax(-1)


@torch.no_grad()
def prefill(model: PreTrainedModel, input_ids: torch.Tensor, press: BasePress | None = None) -> DynamicCache:
    """Run the decoder stack over ``input_ids`` (as KVPress's pipeline does), under ``press`` if given."""
    cache = DynamicCache()
    if press is None:
        model.model(input_ids=input_ids, past_key_values=cache)
    else:
        with press(model):
            model.model(input_ids=input_ids, past_key_values=cache)
    return cache


def positions_of(full_keys: torch.Tensor, kept_keys: torch.Tensor, atol: float = 0.0) -> torch.Tensor:
    """Which rows of ``full_keys`` (batch, heads, length, dim) each kept key is, (batch, heads, n_kept).

    A prefill press never changes the keys it keeps, so each kept key equals exactly one full key (within
    ``atol`` when the two prefills ran different attention implementations).
    """
    matches = torch.cdist(kept_keys.float(), full_keys.float(), p=float("inf")) <= atol
    assert (matches.sum(-1) == 1).all(), "a kept key matches no full-cache key (or several)"
    return matches.float().argmax(-1)


def kept_positions(
    model: PreTrainedModel, input_ids: torch.Tensor, press: BasePress, atol: float = 0.0
) -> list[torch.Tensor]:
    """Per layer, the positions a prefill press keeps, (batch, num_kv_heads, n_kept), in stored order
    (``atol``: for a press that computes the attention itself, see ``positions_of``)."""
    full, compressed = prefill(model, input_ids), prefill(model, input_ids, press)
    return [positions_of(f.keys, c.keys, atol) for f, c in zip(full.layers, compressed.layers, strict=True)]


def history_kept(history, press: BasePress | None) -> list[torch.Tensor]:
    """Per layer, the positions of the history's full cache that the engine's cache for ``press`` holds."""
    compressed = history.compress(press)
    return [
        positions_of(full.keys, kept.keys)
        for full, kept in zip(history.cache.layers, compressed.cache.layers, strict=True)
    ]


class OwnPrefillKnorm(KnormPress):
    """KNorm behind a context manager of its own: a press that may run forward passes of its own, so the engine
    gives it a prefill of its own."""

    @contextmanager
    def __call__(self, model: PreTrainedModel) -> Iterator[None]:
        with super().__call__(model):
            yield


def implementation(spec: str) -> str:
    """The attention a per-cell prefill under the press needs: eager where it reads the weights, else sdpa."""
    from evaluation.catalogue.resolved import resolve_press

    return "eager" if resolve_press(spec).reads_weights else "sdpa"


def same_sets(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x.sort(-1).values, y.sort(-1).values) for x, y in zip(a, b, strict=True))


CHAT_TEMPLATE = BYTE_CHAT_TEMPLATE


def saved_chat_model(folder: Path, arch: str, context: int = 1024) -> Path:
    """``folder`` holding a tiny random model (EOS id 2) and the byte-level chat tokenizer, saved like a hub
    model for the command line (a token per character, so ``context`` bounds the history in characters)."""
    model = tiny_model(arch, "sdpa", context=context)
    model.generation_config.eos_token_id = 2
    model.save_pretrained(folder)
    byte_tokenizer(CHAT_TEMPLATE).save_pretrained(folder)
    return folder


NEAR_TIE = 1e-3  # the largest top-2 logit gap at which two numerically different paths may pick differently


@torch.no_grad()
def top2_gap(model: PreTrainedModel, cache: DynamicCache, ids: list[int], position: int) -> float:
    """The gap between the two largest logits after appending ``ids`` to ``cache`` at ``position`` onwards."""
    positions = torch.arange(position, position + len(ids)).unsqueeze(0)
    logits = model(input_ids=torch.tensor([ids]), past_key_values=cache, position_ids=positions).logits[0, -1]
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The index of the first token where two generations part (None when they are equal)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


PROGRESS_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")  # a run's progress on stderr, timestamped


def without_progress(err: str) -> str:
    """What stderr says besides a run's progress lines."""
    return "\n".join(line for line in err.strip().splitlines() if not PROGRESS_LINE.match(line))
