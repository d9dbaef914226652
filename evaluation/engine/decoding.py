"""Greedy generation: from a press-compressed cache (the per-cell reference path), or from several caches
of one prompt in one batch (the shared path)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from kvpress.presses.base_press import BasePress
from transformers import DynamicCache, PreTrainedModel

from evaluation.catalogue.registry import compresses_while_decoding, prefills_under, question_position
from evaluation.engine.hooks import MASKED, Compressed, kept_tokens, mask_of
from evaluation.engine.ragged import RAGGED_SDPA, RaggedCache
from evaluation.errors import PressCannotRun, press_refusals
from presses.attention import attention_implementation
from presses.teacher_forcing import language_model


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    kept_tokens: int  # keys visible per layer and head, on average, before the question was appended


@torch.no_grad()
def decode(
    model: PreTrainedModel,
    cache: DynamicCache,
    question_ids: torch.Tensor,
    position: int,
    max_new_tokens: int,
    stop_ids: set[int],
    first_logits: torch.Tensor | None = None,
    on_logits: Callable[[torch.Tensor], None] | None = None,
) -> list[int]:
    """Append ``question_ids`` at ``position`` onwards, then decode greedily; returns the generated ids.

    ``first_logits`` (the prefill's last logits) is needed only when there is no question to append. Stops
    after a token in ``stop_ids`` (not included) or ``max_new_tokens`` tokens. ``on_logits`` sees the logits
    (vocab,) each token is chosen from, in order.
    """
    device = model.device
    logits = first_logits
    if question_ids.shape[1]:
        positions = torch.arange(position, position + question_ids.shape[1], device=device).unsqueeze(0)
        outputs = model(
            input_ids=question_ids.to(device), past_key_values=cache, position_ids=positions, logits_to_keep=1
        )
        logits, position = outputs.logits, position + question_ids.shape[1]
    generated: list[int] = []
    going = max_new_tokens > 0
    while going:
        if on_logits is not None:
            on_logits(logits[0, -1])
        going = bool(greedy_step(logits[:, -1], [generated], stop_ids, max_new_tokens))
        if going:
            logits = model(
                input_ids=torch.tensor([generated[-1:]], device=device),
                past_key_values=cache,
                position_ids=torch.tensor([[position]], device=device),
            ).logits
            position += 1
    return generated


def greedy_step(logits: torch.Tensor, generated: list[list[int]], stop_ids: set[int], max_new_tokens: int) -> list[int]:
    """One greedy step of a batch: each row's most likely token under ``logits`` (rows, vocab) is appended to
    that row's ids in ``generated``, unless it is in ``stop_ids`` (which ends the row, the stop id left out) or the
    row already holds ``max_new_tokens``. Returns the rows that go on: those whose new token is to be fed to the
    model, in order."""
    going = []
    for row, token in enumerate(logits.argmax(-1).tolist()):
        if token not in stop_ids and len(generated[row]) < max_new_tokens:
            generated[row].append(token)
            if len(generated[row]) < max_new_tokens:
                going.append(row)
    return going


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    context_ids: torch.Tensor,
    question_ids: torch.Tensor,
    press: BasePress | None,
    max_new_tokens: int,
    stop_ids: set[int],
) -> Generation:
    """Prefill ``context_ids`` under ``press``, append ``question_ids``, then decode greedily, as KVPress's pipeline
    runs a press: a prefill press compresses the context and the question is appended uncompressed; a decoding press
    (``DecodingPress``) leaves the prefill alone and compresses while the question is appended and the answer
    generated; ``PrefillDecodingPress`` does both.

    Positions continue after the full context length, whatever the press kept (after the kept keys for a press that
    re-rotates them, as KVPress's pipeline does). What a press leaves on the attention
    modules for decoding (AdaKV's masked keys) is cleared afterwards. A press that refuses the prompt raises
    ``PressCannotRun``.
    """
    check_eager_fits(model, context_ids.shape[1])
    cache = DynamicCache()
    prefilling = press if press is not None and prefills_under(press) else None
    decoding = press if press is not None and compresses_while_decoding(press) else None
    try:
        with prefilling(model) if prefilling is not None else nullcontext(), press_refusals(press):
            outputs = model(input_ids=context_ids.to(model.device), past_key_values=cache, logits_to_keep=1)
        layers = language_model(model).layers
        masks = [
            mask_of(getattr(layer.self_attn, MASKED, None), cached.keys)
            for layer, cached in zip(layers, cache.layers, strict=True)
        ]
        kept = kept_tokens(cache, masks)
        position = question_position(press, context_ids.shape[1], cache.get_seq_length())
        with decoding(model) if decoding is not None else nullcontext(), press_refusals(press):
            tokens = decode(model, cache, question_ids, position, max_new_tokens, stop_ids, outputs.logits)
    finally:
        for layer in language_model(model).layers:
            layer.self_attn.masked_key_indices = None
    return Generation(tokens, kept)


def check_eager_fits(model: PreTrainedModel, length: int) -> None:
    """Eager attention holds a layer's (heads x length x length) weights, in the model's dtype and again in float32
    for the softmax: a prefill they would not fit in is refused before it runs (``PressCannotRun``)."""
    if model.config._attn_implementation != "eager":
        return
    heads = model.config.num_attention_heads
    needed = heads * length * length * (torch.finfo(model.dtype).bits // 8 + 4)
    device = next(model.parameters()).device
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        import psutil

        free = psutil.virtual_memory().available
    if needed > free:
        raise PressCannotRun(
            f"eager attention over {length} tokens needs {needed:,} bytes ({needed / 2**30:.1f} GiB) for one layer's "
            f"weights and {free:,} are free: a press that reads them cannot run on this example here"
        )


def eos_ids(model: PreTrainedModel) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set(eos) if isinstance(eos, list) else {eos} if eos is not None else set()


@torch.no_grad()
def decode_batch(
    model: PreTrainedModel,
    caches: list[Compressed],
    question_ids: torch.Tensor,
    position: int | list[int],
    max_new_tokens: int,
    stop_ids: set[int],
    first_logits: torch.Tensor | None = None,
    consume: bool = False,
) -> list[list[int]]:
    """``decode`` for several caches that share the question and the positions (as every press's cache of one
    prompt does) in one batch (``evaluation.engine.ragged``: caches of different lengths are neither padded nor
    copied at each step); a sequence leaves the batch when it stops. Returns the generated ids of each cache,
    in order. The caches themselves are not modified, unless ``consume``: then each is released layer by layer
    as the batch copies it (a caller that needs them no more, so that no second copy is ever held).

    ``first_logits`` (1, 1, vocab), the prefill's last logits, is needed only when there is no question.
    ``position``: where the question starts, one for every cache or one per cache (``question_position``).
    """
    if not caches:
        return []
    device = model.device
    starts = [position] * len(caches) if isinstance(position, int) else list(position)
    cache = RaggedCache.from_caches(caches, question_ids.shape[1] + max_new_tokens, consume)
    active = list(range(len(caches)))
    logits = None if first_logits is None else first_logits.expand(len(caches), -1, -1)
    step_ids = question_ids.to(device).expand(len(caches), -1)
    generated: list[list[int]] = [[] for _ in caches]
    appended = 0
    with attention_implementation(model, RAGGED_SDPA):
        while active:
            if step_ids.shape[1]:
                first = {starts[sequence] for sequence in active}
                if len(first) == 1:  # one start for every cache: no per-row positions to copy to the device
                    start = first.pop() + appended
                    positions = torch.arange(start, start + step_ids.shape[1], device=device).expand(len(active), -1)
                else:
                    rows = torch.tensor([starts[sequence] + appended for sequence in active])[:, None]
                    positions = (rows + torch.arange(step_ids.shape[1])).to(device)
                logits = model(
                    input_ids=step_ids, past_key_values=cache, position_ids=positions, logits_to_keep=1
                ).logits
                appended += step_ids.shape[1]
            rows = [generated[sequence] for sequence in active]
            going = greedy_step(logits[:, -1], rows, stop_ids, max_new_tokens)
            step_ids = torch.tensor([rows[row][-1:] for row in going], dtype=torch.long, device=device)
            if len(going) < len(active):
                cache.keep_rows(going)
                active = [active[row] for row in going]
    return generated
