"""The cell server: every protocol's cells of one prompt, served one way.

A prompt is a context and the question asked after it: a single-turn example's prompt (``serve_prompt``), or a
streamed conversation's history so far and its next question (``serve_history``). A cell is a resolved press at a
budget (``catalogue.budgets.Cell``); its press is built at the budget's ratio of the context, then served on one of
two paths:

- shared: one uncompressed prefill of the context (``engine.history``: the prompt's own, or the stream's growing
  history) gives the cell its cache, by the press's own hook on the stored inputs; those caches are decoded in one
  batch, the gold answer's likelihood forced in the same batch (``decoding.decode_batch_forced``);
- its own prefill: KVPress's prefill of the context under the press, then decoding and the forced answer
  (``decoding.generate``), under eager attention where the press reads the weights, the run's attention restored
  afterwards. A press the engine cannot serve (``ResolvedPress.shares_prefill``) takes it, and so does every press
  of a single-turn prompt the engine is not asked to serve (``--path per-cell``, a model with sliding-window layers).

The failed-cell rule: what a press raises while it is built, compresses or runs is its cell's failure, stored with
its reason (``errors.press_cell``); the full-cache cell's error is no press's, and stops the run. A likelihood-only
prompt without a gold answer fails every cell before anything is computed.

Each cell's result (``Served``) holds what every protocol's rows record of it: its path, ratio, kept and generated
tokens, the answer's likelihood and ``measures``: the kept set's overlap with the reference press's cell at its
budget (``engine.overlap``) and, where the prompt asks for it, the answer's retention (``engine.retention``). A
new per-cell measure is computed here, into ``measures``, and reaches every protocol's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from evaluation.catalogue.budgets import Cell, ratio_for
from evaluation.catalogue.registry import OWN_PREFILL, SHARED, question_position
from evaluation.engine.decoding import decode_batch_forced, generate
from evaluation.engine.history import History
from evaluation.engine.hooks import Compressed
from evaluation.engine.overlap import UNKNOWN, overlaps
from evaluation.engine.retention import held_positions, retention
from evaluation.errors import PressCannotRun, press_cell
from evaluation.runs.progress import active
from presses.harness import attention_implementation

CONTEXT = frozenset({"context"})  # a prompt's tokens are of one kind, none of them teacher-forced


@dataclass(frozen=True)
class Server:
    """What serves a run's cells: the model, the run's attention implementation (an own prefill's, unless its press
    reads the weights) and the press whose cell each kept set is compared with (``engine.overlap``)."""

    model: PreTrainedModel
    implementation: str
    reference: str


@dataclass(frozen=True)
class Asked:
    """What every cell of one prompt answers: the question's ids (1, question), the gold answer as its likelihood
    forces it ([]: none), the most tokens generated (0: none) and the ids that stop a generation. ``name`` names
    the prompt in a refusal; ``progress`` labels a step bar over the batch's decoding ("": none); ``spans``: the
    positions of the answer's copies in the context, where retention is measured (None: it is not)."""

    ids: torch.Tensor
    answer_ids: list[int]
    max_new_tokens: int
    stop_ids: set[int]
    name: str
    likelihood_only: bool = False
    progress: str = ""
    spans: list[list[int]] | None = None

    def refusal(self) -> str:
        """Why no cell of the prompt can run ("" when they can): a likelihood-only prompt without a gold answer."""
        if self.likelihood_only and not self.answer_ids:
            return f"{self.name} has no gold answer: no likelihood to score"
        return ""

    def unmeasured(self) -> dict:
        """The measures of a cell whose kept set is unknown (its own prefill) or that failed: None each, but the
        overlap of a failed cell, which has none."""
        return {} if self.spans is None else {"retention": None}


@dataclass(frozen=True)
class Served:
    """One cell's result: its ``path`` (``SHARED``, or its own prefill: ``OWN_PREFILL``, ``DECODING``), the ratio
    its press was built at, the attention ``implementation`` of its prefill, the ids it generated, the tokens its
    cache kept, the gold answer's likelihood (mean nats per token, None without an answer) and its tokens, and its
    ``measures``; a failed cell holds its ``error`` (one line) instead."""

    cell: Cell
    ratio: float
    path: str
    implementation: str = ""
    token_ids: list[int] = field(default_factory=list)
    kept_tokens: int = 0
    answer_nll: float | None = None
    answer_tokens: int = 0
    measures: dict = field(default_factory=dict)
    error: str = ""


@dataclass
class Derived:
    """A cell's cache built from the history, where its question starts, and its measures."""

    cell: Cell
    ratio: float
    cache: Compressed
    start: int
    measures: dict = field(default_factory=dict)


def serve_prompt(
    server: Server, context_ids: torch.Tensor, cells: list[Cell], asked: Asked, shared: bool
) -> Iterator[Served]:
    """A single-turn prompt's cells, each as soon as it is finished: with ``shared`` (and a model without
    sliding-window layers), those the engine serves from one prefill of ``context_ids`` (1, context), decoded in one
    batch; then each other on its own prefill."""
    engine = shared and History.serves(server.model)
    served = [cell for cell in cells if engine and cell.press.shares_prefill]
    if served:
        yield from prefilled(server, context_ids, served, asked)
    own = [cell for cell in cells if not (engine and cell.press.shares_prefill)]
    yield from own_prefills(server, context_ids, own, asked)


def prefilled(server: Server, context_ids: torch.Tensor, cells: list[Cell], asked: Asked) -> list[Served]:
    """The cells served from one full-cache prefill of ``context_ids`` (the run's attention), which is released
    before the batch decodes: its cache joins the batch as the full-cache cell's."""
    length, refusal = context_ids.shape[1], asked.refusal()
    if refusal:
        return [failure(cell, ratio_for(cell.budget, length), SHARED, refusal, asked) for cell in cells]
    server.model.set_attn_implementation(server.implementation)
    history = History(server.model, CONTEXT, [cell.press.needs for cell in cells])
    history.extend(context_ids[0].tolist(), "context")
    derived, failed = compressed(server, history, cells, asked)
    first_logits = history.newest_logits
    for one in derived:
        one.cache.owned = True  # the history is done with: the batch takes over its cache too (the full cache's)
    del history
    return failed + decoded(server, derived, asked, first_logits)


def serve_history(server: Server, history: History, cells: list[Cell], asked: Asked) -> list[Served]:
    """A streamed question's cells, in their order: those the engine serves from ``history`` (which goes on),
    decoded in one batch, then each other on its own prefill of the whole history."""
    refusal = asked.refusal()
    if refusal:
        return [failure(cell, ratio_for(cell.budget, history.length), path(cell), refusal, asked) for cell in cells]
    derived, failed = compressed(server, history, [cell for cell in cells if cell.press.shares_prefill], asked)
    served = failed + decoded(server, derived, asked, history.newest_logits)
    context = torch.tensor([history.token_ids], device=server.model.device)
    served += own_prefills(server, context, [cell for cell in cells if not cell.press.shares_prefill], asked)
    order = {id(cell): index for index, cell in enumerate(cells)}
    return sorted(served, key=lambda result: order[id(result.cell)])


def rule(cell: Cell) -> Callable[[object], AbstractContextManager]:
    """The failed-cell rule of ``cell``: a press's error is its failure (``press_cell``); the full cache's is none."""
    return nullcontext if cell.budget is None else press_cell


def path(cell: Cell) -> str:
    """The path a cell's press takes where the engine serves what it can."""
    return SHARED if cell.press.shares_prefill else own_path(cell)


def own_path(cell: Cell) -> str:
    """The path of a cell on its own prefill: its press's own (``OWN_PREFILL``, ``DECODING``), or ``OWN_PREFILL``
    for a press the engine could have served."""
    return OWN_PREFILL if cell.press.needs.path == SHARED else cell.press.needs.path


def failure(cell: Cell, ratio: float, on: str, error: PressCannotRun | str, asked: Asked) -> Served:
    return Served(cell, ratio, on, error=str(error).splitlines()[0], measures=asked.unmeasured())


def compressed(server: Server, history: History, cells: list[Cell], asked: Asked) -> tuple[list[Derived], list[Served]]:
    """Each cell's cache from ``history`` by its press's own hook, measured; and the cells that failed."""
    length, derived, failed = history.length, [], []
    for cell in cells:
        ratio = ratio_for(cell.budget, length)
        try:
            with rule(cell)(cell.label):
                press = cell.press.build(ratio, length)
            with rule(cell)(press):
                cache = history.compress(press)
        except PressCannotRun as error:
            failed.append(failure(cell, ratio, SHARED, error, asked))
            continue
        derived.append(Derived(cell, ratio, cache, question_position(press, length, cache.cache.get_seq_length())))
    measure(server, history, derived, asked.spans)
    return derived, failed


def measure(server: Server, history: History, derived: list[Derived], spans: list[list[int]] | None) -> None:
    """Each derived cache's measures: its kept set's overlap with the reference press's at its budget, and the
    answer's retention where ``spans`` is given."""
    held = [held_positions(history.cache, one.cache) for one in derived]
    named = [(one.cell.label, one.cell.budget_key) for one in derived]
    for one, overlap in zip(derived, overlaps(named, held, server.reference), strict=True):
        one.measures.update(overlap)
    del held
    for one in derived if spans is not None else []:
        one.measures["retention"] = retention(history.cache, one.cache, spans)


def decoded(server: Server, derived: list[Derived], asked: Asked, first_logits: torch.Tensor | None) -> list[Served]:
    """The derived caches decoded in one batch, consumed as it copies them, the answer forced in the batch."""
    if not derived:
        return []
    label = f"{asked.progress}: decoding {len(derived)} caches"
    bar = active().bar(asked.max_new_tokens, label, "token", step=True) if asked.progress else nullcontext()
    with bar as steps:
        generated, nlls = decode_batch_forced(
            server.model,
            [one.cache for one in derived],
            asked.ids,
            [one.start for one in derived],
            asked.max_new_tokens,
            asked.stop_ids,
            asked.answer_ids,
            first_logits,
            consume=True,
            on_step=None if steps is None else steps.update,
        )
    answer, implementation = len(asked.answer_ids), server.implementation
    return [
        Served(one.cell, one.ratio, SHARED, implementation, tokens, one.cache.kept_tokens, nll, answer, one.measures)
        for one, tokens, nll in zip(derived, generated, nlls, strict=True)
    ]


def own_prefills(server: Server, context_ids: torch.Tensor, cells: Iterable[Cell], asked: Asked) -> Iterator[Served]:
    """Each cell on its own prefill of ``context_ids`` under its press (eager where it reads the weights)."""
    length, refusal, model = context_ids.shape[1], asked.refusal(), server.model
    for cell in cells:
        ratio = ratio_for(cell.budget, length)
        implementation = "eager" if cell.press.reads_weights else server.implementation
        try:
            if refusal:
                raise PressCannotRun(refusal)
            with rule(cell)(cell.label):
                press = cell.press.build(ratio, length)
            with rule(cell)(press), attention_implementation(model, implementation):
                generation = generate(
                    model, context_ids, asked.ids, press, asked.max_new_tokens, asked.stop_ids, asked.answer_ids
                )
        except PressCannotRun as error:
            yield failure(cell, ratio, own_path(cell), error, asked)
            continue
        answer, measures = len(asked.answer_ids), {**UNKNOWN, **asked.unmeasured()}
        tokens, kept, nll = generation.token_ids, generation.kept_tokens, generation.answer_nll
        yield Served(cell, ratio, own_path(cell), implementation, tokens, kept, nll, answer, measures)
