"""Streaming batched across presses: every press's cells at one budget stream the texts in one batch, one model
forward per token (or chunk) for all of them, each press evicting its own rows by its own rule.

The batch holds one block of rows per press (its texts, in order). After each attention layer, ``BatchedStream``'s
one hook hands each press's ``DecodingPress`` its own block, as if it ran alone: the block's rows of the layer's
input and output, and a stand-in cache of its own (one per press, kept across steps, so a press that follows its
cache (RMM's smoother) finds it again) holding views of its rows of every layer; what the press leaves there is
written back into the batch's cache. The engine's rule for the shared prefill (each press's own hook on its own
inputs), for decoding steps. Presses at one budget all hold the same number of tokens after every step (the budget,
or everything while the text is shorter), so the batch's cache stays rectangular.

RMM's teacher-forced weights read the model's predictions from hooks on the decoder stack: each RMM records its
own block's rows (``Transcript.attach(rows=...)``), whose predictions are those of its own cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import kvpress as k
import torch
from kvpress.presses.base_press import BasePress
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from evaluation.engine.hooks import cache_of
from evaluation.protocols.perplexity.stream import streamed_nll
from presses.harness import RMMPress, every_press


def batchable(press: BasePress) -> bool:
    """Whether ``press`` (a ``DecodingPress``) streams as one block of a batch: AdaKV's head-wise masks
    (``masked_key_indices``, which the attention reads for the whole batch) and RMM's fused pass (hooks on the
    attention itself) stream one cell at a time."""
    held = every_press(press)
    return not any(isinstance(p, k.AdaKVPress) or (isinstance(p, RMMPress) and p.fused_attention) for p in held)


@dataclass
class Block:
    """One press's rows of the batch and its stand-in cache (None until its first step)."""

    press: BasePress
    rows: slice
    cache: DynamicCache | None = None


def rows_of(value: object, rows: slice, batch: int) -> object:
    """``value`` at the batch ``rows`` when it is a tensor of two axes or more (not ``cache_position``) with a row
    per sequence of the batch, or a tuple or list of such; else as it is."""
    if isinstance(value, (tuple, list)):
        return type(value)(rows_of(item, rows, batch) for item in value)
    if isinstance(value, torch.Tensor) and value.ndim > 1 and value.shape[0] == batch > 1:
        return value[rows]
    return value


@dataclass
class BatchedStream(BasePress):
    """``presses`` (each a ``DecodingPress``) over consecutive blocks of ``texts`` rows each, in one batch."""

    presses: list[BasePress] = field(default_factory=list)
    texts: int = 1
    blocks: list[Block] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.blocks = [Block(p, slice(i * self.texts, (i + 1) * self.texts)) for i, p in enumerate(self.presses)]

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        for block in self.blocks:
            block.press.post_init_from_model(model)
            for held in every_press(block.press):
                if isinstance(held, RMMPress) and held.from_predictions:
                    confident = held.correctness == "confidence"
                    held._transcript.attach(model, held, confident=confident, rows=block.rows)

    def forward_hook(self, module: nn.Module, input: list[torch.Tensor], kwargs: dict, output: list):
        """Each block's press's own hook on its rows; the batch's cache layer then holds what each left."""
        cache, index = kwargs["past_key_values"], module.layer_idx
        batch = cache.layers[index].keys.shape[0]
        kept = []
        for block in self.blocks:
            views = self._hand_rows(block, cache, index)
            sliced = {name: rows_of(value, block.rows, batch) for name, value in kwargs.items()}
            block.press.forward_hook(
                module, input, sliced | {"past_key_values": block.cache}, rows_of(output, block.rows, batch)
            )
            stand_in = block.cache.layers[index]
            kept.append((stand_in.keys, stand_in.values, stand_in.keys is views[0] and stand_in.values is views[1]))
        if not all(same for _, _, same in kept):
            lengths = sorted({keys.shape[2] for keys, _, _ in kept})
            if len(lengths) > 1:
                raise ValueError(
                    f"the presses of one batch kept {lengths} tokens in layer {index}: give them one budget"
                )
            layer = cache.layers[index]
            layer.keys, layer.values = torch.cat([k for k, _, _ in kept]), torch.cat([v for _, v, _ in kept])
        return output

    @staticmethod
    def _hand_rows(block: Block, cache: DynamicCache, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Point the block's stand-in cache at its rows of the batch's layer ``index`` (views), creating the
        stand-in (and its layers up to ``index``, from the batch's) when first needed; returns the views."""
        if block.cache is None:
            block.cache = cache_of([])
        for missing in range(len(block.cache.layers), index + 1):
            layer = cache.layers[missing]
            block.cache.layers.append(cache_of([(layer.keys[block.rows], layer.values[block.rows])]).layers[0])
        layer, stand_in = cache.layers[index], block.cache.layers[index]
        stand_in.keys, stand_in.values = layer.keys[block.rows], layer.values[block.rows]
        return stand_in.keys, stand_in.values


def batched_nll(
    model: PreTrainedModel,
    token_ids: torch.Tensor,
    presses: list[BasePress],
    chunk: int,
    on_forward: Callable[[], None] = lambda: None,
) -> list[torch.Tensor]:
    """``streamed_nll`` of ``token_ids`` (texts, length) under each of ``presses`` (``DecodingPress``es at one
    budget), in one batch: one forward per token (or chunk) for them all, ``on_forward`` after each. Returns each
    press's (texts, length - 1)."""
    texts = token_ids.shape[0]
    nll = streamed_nll(model, token_ids.repeat(len(presses), 1), BatchedStream(presses, texts), chunk, on_forward)
    return list(nll.split(texts))
