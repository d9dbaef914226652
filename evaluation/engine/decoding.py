"""Greedy generation: from a press-compressed cache (the per-cell reference path), or from several caches
of one prompt in one batch (the shared path)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from kvpress.presses.base_press import BasePress
from transformers import DynamicCache, PreTrainedModel

from evaluation.catalogue.registry import compresses_while_decoding, prefills_under, question_position
from evaluation.engine.hooks import MASKED, Compressed, kept_tokens, mask_of
from evaluation.engine.ragged import RAGGED_SDPA, RaggedCache
from evaluation.errors import MemoryRefusal
from presses.harness import attention_implementation, language_model


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    kept_tokens: int  # keys visible per layer and head, on average, before the question was appended
    answer_nll: float | None = None  # the forced answer's mean negative log-likelihood per token (nats), if asked


@torch.no_grad()
def appended_question(
    model: PreTrainedModel,
    cache: DynamicCache,
    question_ids: torch.Tensor,
    position: int,
    first_logits: torch.Tensor | None,
) -> tuple[torch.Tensor | None, int]:
    """The question appended to ``cache`` from ``position``: its last logits and the next position (the cache's
    ``first_logits`` and ``position`` as they are when there is no question)."""
    if not question_ids.shape[1]:
        return first_logits, position
    positions = torch.arange(position, position + question_ids.shape[1], device=model.device).unsqueeze(0)
    outputs = model(
        input_ids=question_ids.to(model.device), past_key_values=cache, position_ids=positions, logits_to_keep=1
    )
    return outputs.logits, position + question_ids.shape[1]


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
    logits, position = appended_question(model, cache, question_ids, position, first_logits)
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
    answer_ids: list[int] | None = None,
) -> Generation:
    """Prefill ``context_ids`` under ``press``, append ``question_ids``, then decode greedily, as KVPress's pipeline
    runs a press: a prefill press compresses the context and the question is appended uncompressed; a decoding press
    (``DecodingPress``) leaves the prefill alone and compresses while the question is appended and the answer
    generated; ``PrefillDecodingPress`` does both.

    Positions continue after the full context length, whatever the press kept (after the kept keys for a press that
    re-rotates them, as KVPress's pipeline does). What a press leaves on the attention
    modules for decoding (AdaKV's masked keys) is cleared afterwards. Errors pass through as they are raised: the
    caller decides whose they are (``evaluation.errors.press_cell``). An eager prefill this device has not the
    memory for is refused before it runs (``check_eager_fits``).

    With ``answer_ids``, the answer is also teacher-forced after the question on a copy of the prefill's cache,
    taken before decoding (so the generation is the same as without it), by the same path (``force``): its mean
    negative log-likelihood is the generation's ``answer_nll``.
    """
    check_eager_fits(model, context_ids.shape[1])
    cache = DynamicCache()
    prefilling = press if press is not None and prefills_under(press) else None
    decoding = press if press is not None and compresses_while_decoding(press) else None
    try:
        with prefilling(model) if prefilling is not None else nullcontext():
            outputs = model(input_ids=context_ids.to(model.device), past_key_values=cache, logits_to_keep=1)
        layers = language_model(model).layers
        masks = [
            mask_of(getattr(layer.self_attn, MASKED, None), cached.keys)
            for layer, cached in zip(layers, cache.layers, strict=True)
        ]
        kept = kept_tokens(cache, masks)
        position = question_position(press, context_ids.shape[1], cache.get_seq_length())
        forced = copy.deepcopy(cache) if answer_ids and max_new_tokens else cache  # no generation, no copy
        tokens: list[int] = []
        if max_new_tokens:
            with decoding(model) if decoding is not None else nullcontext():
                tokens = decode(model, cache, question_ids, position, max_new_tokens, stop_ids, outputs.logits)
        nll = None
        if answer_ids:
            del cache  # the generation's: only the copy is needed now
            # a decoding press starts afresh (it resets on leaving its context), as it started for the generation
            with decoding(model) if decoding is not None else nullcontext():
                nll = force(model, forced, question_ids, position, answer_ids, outputs.logits, decoding is not None)
    finally:
        for layer in language_model(model).layers:
            layer.self_attn.masked_key_indices = None
    return Generation(tokens, kept, nll)


def answer_ids_of(tokenizer, answer: str | None, limit: int) -> list[int]:
    """The answer's tokens as the likelihood forces them: the tokenizer's encoding of the answer text alone,
    without special tokens, cut to ``limit`` (the task's official answer length)."""
    if answer is None:
        return []
    return tokenizer.encode(str(answer), add_special_tokens=False)[:limit]


def mean_nll(logits: torch.Tensor, answer_ids: list[int]) -> float:
    """The mean negative log-likelihood per token (nats) of ``answer_ids`` under ``logits`` (answer, vocab), each
    row the prediction of its token, in float32."""
    target = torch.tensor(answer_ids, device=logits.device)
    return torch.nn.functional.cross_entropy(logits.float(), target).item()


@torch.no_grad()
def force(
    model: PreTrainedModel,
    cache: DynamicCache,
    question_ids: torch.Tensor,
    position: int,
    answer_ids: list[int],
    first_logits: torch.Tensor | None,
    stepwise: bool = False,
) -> float:
    """Append ``question_ids`` to ``cache`` at ``position``, then teacher-force ``answer_ids`` after it; returns the
    answer's mean negative log-likelihood per token (``mean_nll``). ``first_logits``: the prefill's last logits,
    needed only without a question. ``stepwise``: token by token, as ``decode`` feeds its own tokens (a press that
    compresses while decoding sees each step as it would while generating); else in one forward of the question
    and the answer. The cache is extended."""
    device = model.device
    if not stepwise:
        positions = torch.arange(position, position + question_ids.shape[1] + len(answer_ids) - 1, device=device)
        return forced_nlls(model, cache, question_ids.to(device), positions[None], answer_ids, first_logits)[0]
    logits, position = appended_question(model, cache, question_ids, position, first_logits)
    predicted = [logits[0, -1]]
    for token in answer_ids[:-1]:
        logits = model(
            input_ids=torch.tensor([[token]], device=device),
            past_key_values=cache,
            position_ids=torch.tensor([[position]], device=device),
        ).logits
        predicted.append(logits[0, -1])
        position += 1
    return mean_nll(torch.stack(predicted), answer_ids)


@torch.no_grad()
def forced_nlls(
    model: PreTrainedModel,
    cache: DynamicCache | RaggedCache,
    question_ids: torch.Tensor,
    positions: torch.Tensor,
    answer_ids: list[int],
    first_logits: torch.Tensor | None,
) -> list[float]:
    """One forward of the question and the answer but its last token over a batch of caches (rows): each row's
    answer likelihood (``mean_nll``). ``question_ids`` (rows or 1, question) on the model's device;
    ``positions`` (rows or 1, question + answer - 1); ``first_logits`` (1, 1, vocab), the prefill's last logits,
    needed only when there is no question: they predict the answer's first token."""
    rows = max(question_ids.shape[0], positions.shape[0])
    answer = torch.tensor([answer_ids[:-1]], dtype=torch.long, device=question_ids.device)
    question = question_ids.long()  # an empty question's ids may be a float tensor (``torch.tensor([[]])``)
    inputs = torch.cat([question.expand(rows, -1), answer.expand(rows, -1)], dim=1)
    first = None
    if question_ids.shape[1] == 0:
        if first_logits is None:
            raise ValueError("without a question, the prefill's last logits predict the answer's first token")
        first = first_logits[0, -1:]
    needed = len(answer_ids) - (first is not None)  # positions whose hidden state predicts an answer token
    hidden = None
    if needed:
        hidden = language_model(model)(
            input_ids=inputs, past_key_values=cache, position_ids=positions.expand(rows, -1)
        ).last_hidden_state[:, -needed:]
    lm_head = model.get_output_embeddings()
    nlls = []
    for row in range(rows):  # one row's logits at a time: (answer, vocab) in float32
        logits = [] if hidden is None else [lm_head(hidden[row])]
        if first is not None:
            logits.insert(0, first.to(logits[0].dtype) if logits else first)
        nlls.append(mean_nll(torch.cat(logits), answer_ids))
    return nlls


def eager_bytes_per_weight(dtype: torch.dtype) -> int:
    """The bytes each attention weight takes at eager attention's peak: the weights in the model's dtype, their
    float32 copy, and its softmax (a float32 model's weights are their own copy)."""
    size = torch.finfo(dtype).bits // 8
    return size + 4 + (4 if size != 4 else 0)


def check_eager_fits(model: PreTrainedModel, length: int) -> None:
    """Eager attention holds a layer's (heads x length x length) weights, ``eager_bytes_per_weight`` bytes each at
    its peak: a prefill that would not fit in what this device has free (the caching allocator's freed blocks
    included) is refused before it runs (``MemoryRefusal``: the run stops, nothing is stored for the cell)."""
    if model.config._attn_implementation != "eager":
        return
    heads = model.config.num_attention_heads
    needed = heads * length * length * eager_bytes_per_weight(model.dtype)
    free = free_memory(next(model.parameters()).device)
    if needed > free:
        raise MemoryRefusal(
            f"eager attention over {length} tokens needs {needed:,} bytes ({needed / 2**30:.1f} GiB) for one layer's "
            f"weights and {free:,} are free: run this press on a device with more memory (or shorter inputs); "
            "nothing is stored for the cell, so the same command runs it there"
        )


def free_memory(device: torch.device) -> int:
    """Bytes a new tensor on ``device`` may take: the device's free memory and what the caching allocator holds
    but has freed (CUDA); the machine's available memory (CPU)."""
    if device.type == "cuda":
        held_unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + held_unused
    import psutil

    return psutil.virtual_memory().available


def eos_ids(model: PreTrainedModel) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set(eos) if isinstance(eos, list) else {eos} if eos is not None else set()


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
    return decode_batch_forced(
        model, caches, question_ids, position, max_new_tokens, stop_ids, [], first_logits, consume
    )[0]


@torch.no_grad()
def decode_batch_forced(
    model: PreTrainedModel,
    caches: list[Compressed],
    question_ids: torch.Tensor,
    position: int | list[int],
    max_new_tokens: int,
    stop_ids: set[int],
    answer_ids: list[int],
    first_logits: torch.Tensor | None = None,
    consume: bool = False,
    on_step: Callable[[], None] | None = None,
) -> tuple[list[list[int]], list[float | None]]:
    """``decode_batch``, and in the same batch, before decoding, the answer ``answer_ids`` teacher-forced after the
    question over every cache (one forward, ``forced_nlls``) in the batch's scratch space (``RaggedCache.scratch``:
    what it appends is forgotten, so the decoding that follows is the same as without it). Returns the generated
    ids and each cache's answer likelihood (mean nats per token; None for every cache when ``answer_ids`` is
    empty). ``max_new_tokens`` 0: the likelihood alone, nothing decoded. ``on_step`` is called after each token
    step of the batch (a progress bar)."""
    if not caches:
        return [], []
    device = model.device
    starts = [position] * len(caches) if isinstance(position, int) else list(position)
    room = question_ids.shape[1] + max(max_new_tokens, len(answer_ids))  # the answer is no longer than a generation
    cache = RaggedCache.from_caches(caches, room, consume)
    active = list(range(len(caches)))
    logits = None if first_logits is None else first_logits.expand(len(caches), -1, -1)
    step_ids = question_ids.to(device).expand(len(caches), -1)
    generated: list[list[int]] = [[] for _ in caches]
    nlls: list[float | None] = [None] * len(caches)
    appended = 0
    with attention_implementation(model, RAGGED_SDPA):
        if answer_ids:
            with cache.scratch():
                forced = step_ids.shape[1] + len(answer_ids) - 1
                nlls = list(
                    forced_nlls(
                        model, cache, step_ids, _positions(starts, active, 0, forced, device), answer_ids, first_logits
                    )
                )
        while active and max_new_tokens:
            if step_ids.shape[1]:
                positions = _positions(starts, active, appended, step_ids.shape[1], device)
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
            if on_step is not None:
                on_step()
    return generated, nlls


def _positions(starts: list[int], active: list[int], appended: int, length: int, device: torch.device) -> torch.Tensor:
    """The positions of ``length`` new tokens of each active sequence, ``appended`` after its question's start."""
    first = {starts[sequence] for sequence in active}
    if len(first) == 1:  # one start for every cache: no per-row positions to copy to the device
        start = first.pop() + appended
        return torch.arange(start, start + length, device=device).expand(len(active), -1)
    rows = torch.tensor([starts[sequence] + appended for sequence in active])[:, None]
    return (rows + torch.arange(length)).to(device)
