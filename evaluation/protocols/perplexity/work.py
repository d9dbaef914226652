"""The perplexity protocol's work: its settings and texts checked, its plan and dry run, its cells' streams, and
its scorecard (``evaluation.protocols.perplexity.card``).

The texts are cut to one length, so their caches hold the same number of tokens at every step and stream as one
batch. A unit is every press at one budget over every text, streamed in one batch with a block of rows per press
(``batched``: one forward per token for them all), or the full cache over every text; with
``--cells-one-at-a-time`` a unit is one cell, a press at a budget, streamed as a batch of its own (the reference:
KVPress's presses compress a whole batch to one size, so such a batch holds one press at one budget)."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from kvpress.presses.base_press import BasePress
from transformers import AutoTokenizer, PreTrainedModel

from evaluation.catalogue.budgets import Budget, budget_key, budget_label
from evaluation.catalogue.resolved import ResolvedPress, resolve_press, resolve_presses
from evaluation.catalogue.specs import FULL_CACHE
from evaluation.errors import EvaluationError, PressCannotRun, press_cell
from evaluation.protocols.perplexity.batched import batchable, batched_nll
from evaluation.protocols.perplexity.card import write_perplexity_card
from evaluation.protocols.perplexity.config import BATCHED, CELL_BY_CELL, PerplexityConfig
from evaluation.protocols.perplexity.protocol import POSITION_WINDOW, Perplexity, PerplexityRow
from evaluation.protocols.perplexity.stream import base_press, decoding_press, pieces, streamed_nll
from evaluation.protocols.protocol import Implementation, Plan, implement
from evaluation.protocols.texts import source_file, source_text, text_tokens
from evaluation.runs.backends import Unit
from evaluation.runs.models import resolve_model_path, what_loading_fetches
from evaluation.runs.progress import active
from evaluation.runs.record import fingerprint
from evaluation.runs.store import ResultStore

BYTES_PER_TOKEN = 64  # the most of a --text-file read for each token streamed


@dataclass(frozen=True)
class Cell:
    """One press at one budget (None: the full cache) over every text, its press resolved (it travels to the
    worker that streams it); ``refusal`` says why the press cannot hold the budget at all (its rows are recorded
    failed, nothing streamed)."""

    press: ResolvedPress
    budget: Budget | None
    refusal: str = ""

    @property
    def label(self) -> str:
        return self.press.label


@dataclass(frozen=True)
class Streamed:
    """A unit's payload: its cells (the full cache, or presses at one budget) and the texts' names and token ids
    (texts, length)."""

    cells: list[Cell]
    names: list[str]
    token_ids: list[list[int]]


def checked_presses(config: PerplexityConfig, dry_run: bool = False) -> tuple[list[ResolvedPress], dict[str, str]]:
    """The run's presses, each checked streamable in the run's form before any data (a dry run builds none), and
    what each streams as where that is not its own press."""
    if not config.texts and not config.text_files:
        raise EvaluationError("no texts: give --texts (multi_news:N, locomo:SAMPLE_ID, essays:N) or --text-file")
    if config.chunk >= config.length:
        raise EvaluationError(f"--chunk {config.chunk} must be below --length {config.length}")
    presses = resolve_presses(config.presses, config.allow_import, dry_run)
    if any(press.label != FULL_CACHE for press in presses) and not config.budgets:
        raise EvaluationError("no budget: give at least one --budgets value")
    streamed_as = {}
    for press in presses:
        if press.label != FULL_CACHE and not press.dry:
            streamed_as[press.label] = base_press(press, config.chunk)[1]
    return presses, {label: rule for label, rule in streamed_as.items() if rule}


def cells(presses: list[ResolvedPress], budgets: list[Budget]) -> list[Cell]:
    """The full cache once (if asked for), then every other press at every budget; a budget a press cannot hold
    (RMM's lag at or above it) is a cell of failed rows."""
    full = [Cell(press, None) for press in presses if press.label == FULL_CACHE][:1]
    return full + [
        Cell(press, budget, press.budget_refusal(int(budget.value)))
        for press in presses
        if press.label != FULL_CACHE
        for budget in budgets
    ]


def unit_cells(grid: list[Cell], one_at_a_time: bool) -> list[list[Cell]]:
    """The cells of each unit: the full cache alone, then every press at one budget together (or each cell alone,
    ``one_at_a_time``)."""
    if one_at_a_time:
        return [[cell] for cell in grid]
    by_budget: dict[str, list[Cell]] = {}
    for cell in grid:
        if cell.budget is not None:
            by_budget.setdefault(budget_key(cell.budget), []).append(cell)
    return [[cell] for cell in grid if cell.budget is None] + list(by_budget.values())


def unit_name(cells: list[Cell]) -> str:
    budget = budget_key(cells[0].budget)
    return f"{cells[0].label} @ {budget}" if len(cells) == 1 else f"{len(cells)} presses @ {budget}"


def own_texts(config: PerplexityConfig) -> list[tuple[str, Path]]:
    """Each ``--text-file``'s name and path: a file, given once (another name of one given before, a link or a
    second path, is an error: its text would be tallied twice)."""
    sources: list[tuple[str, Path]] = []
    for given in config.text_files:
        path = Path(given)
        if not path.is_file():  # nor a folder, a pipe (whose read would wait) or a device
            why = "is not a file (a folder, a pipe or a device)" if path.exists() else "not found"
            raise EvaluationError(f"--text-file {given} {why}: give a UTF-8 text file")
        same = next((earlier for _, earlier in sources if path.samefile(earlier)), None)
        if same is not None:
            raise EvaluationError(f"--text-file {given} is {same}, given before (a link or another path): give it once")
        sources.append((f"file:{path.name}", path))
    return sources


def text_sources(config: PerplexityConfig) -> list[tuple[str, Path]]:
    """Each text's name and the file it comes from."""
    sources = [(spec, source_file(spec, config.data_root)) for spec in config.texts] + own_texts(config)
    names = [name for name, _ in sources]
    if len(set(names)) != len(names):
        raise EvaluationError(f"texts named twice in {names}: give each text once (files by distinct names)")
    return sources


def text_token_ids(config: PerplexityConfig) -> tuple[list[str], list[list[int]]]:
    """Each text's name and its first ``length`` tokens (the tokenizer's encoding without special tokens); a text
    shorter than that is refused."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(config.model.name), trust_remote_code=False)
    names, token_ids = [], []
    for name, path in text_sources(config):
        own = name.startswith("file:")
        text = text_file(path, config.length) if own else source_text(name, config.data_root)
        names.append(name)
        token_ids.append(text_tokens(tokenizer, text, config.length, name))
    return names, token_ids


def text_file(path: Path, length: int) -> str:
    """The start of a user's text file that ``length`` tokens can come from (at most ``BYTES_PER_TOKEN`` bytes a
    token: a large file is never read whole), as UTF-8; a file that is not is an error naming it."""
    limit = length * BYTES_PER_TOKEN
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
        return codecs.getincrementaldecoder("utf-8")().decode(data[:limit], final=len(data) <= limit)
    except UnicodeDecodeError as error:
        raise EvaluationError(f"--text-file {path}: not UTF-8 (byte {error.start}): save it as UTF-8") from None
    except OSError as error:
        raise EvaluationError(f"--text-file {path}: cannot be read ({error.strerror})") from None


def dry_run(protocol: Perplexity, config: PerplexityConfig) -> str:
    presses, streamed_as = checked_presses(config, dry_run=True)
    own_texts(config)
    grid = cells(presses, config.budgets)
    streamed = [cell for cell in grid if not cell.refusal]
    texts = len(config.texts) + len(config.text_files)
    forwards = len(pieces(config.length, config.chunk))
    lines = [
        f"Perplexity: {texts} texts x {config.length} tokens, {config.form}, model {config.model.label}",
        *(
            f"  {cell.label} @ {budget_label(cell.budget, config.length)}"
            + (f" (failed rows: {cell.refusal})" if cell.refusal else "")
            for cell in grid
        ),
        *(f"  {label} streams as {rule}" for label, rule in streamed_as.items()),
        forwards_line(unit_cells(streamed, config.cells_one_at_a_time), forwards, texts),
    ]
    fetched = what_loading_fetches(config.model.name)
    return "\n".join([*lines, f"a real run first fetches: {fetched}" if fetched else "everything it reads is local"])


def forwards_line(units: list[list[Cell]], forwards: int, texts: int) -> str:
    """The dry run's count of model forwards: per unit, one per piece, each a batch of its cells x the texts."""
    rows = ", ".join(str(len(cells) * texts) for cells in units)
    return f"forwards: {len(units)} streams x {forwards} = {len(units) * forwards}, of batches of {rows} rows"


def plan(protocol: Perplexity, config: PerplexityConfig) -> Plan:
    presses, streamed_as = checked_presses(config)
    names, token_ids = text_token_ids(config)
    units = []
    for unit in unit_cells(cells(presses, config.budgets), config.cells_one_at_a_time):
        keys = frozenset((name, cell.label, budget_key(cell.budget)) for cell in unit for name in names)
        units.append(Unit(unit_name(unit), Streamed(unit, names, token_ids), keys))
    settings = {
        "data_root": str(config.data_root),
        "form": config.form,
        "path": config.path,
        "streamed_as": streamed_as,
        "data_fingerprint": fingerprint(*dict.fromkeys(path for _, path in text_sources(config))),
    }
    return Plan(units, partial(work, config=config, streamed_as=streamed_as), settings, sample=("data_fingerprint",))


def work(loaded, unit: Unit, store: ResultStore, config: PerplexityConfig, streamed_as: dict[str, str]) -> None:
    """Stream every text under the unit's cells still missing from ``store``, and append a row per text and cell:
    a cell its budget refuses, or whose press fails (``press_cell``), as failed rows; the others in one batch
    (``batched``), but for a press that streams only on its own (``batched.batchable``), a lone cell and the full
    cache, each a batch of its own. A batch that fails streams its cells one at a time, so that only the failing
    press's cells fail."""
    model, _ = loaded
    streamed: Streamed = unit.payload
    todo = [cell for cell in streamed.cells if missing(cell, streamed.names, store)]
    presses: dict[Cell, BasePress | None] = {}
    for cell in todo:
        try:
            if cell.refusal:
                raise PressCannotRun(cell.refusal)
            with nullcontext() if cell.budget is None else press_cell(cell.label):
                presses[cell] = cell_press(cell, config)
        except PressCannotRun as error:
            failed(store, identity(cell, config), streamed.names, str(error))
    together = [cell for cell, press in presses.items() if press is not None and batchable(press)]
    together = together if len(together) > 1 else []
    ids = torch.tensor(streamed.token_ids)
    forwards = len(pieces(config.length, config.chunk))
    if together:
        try:
            with press_cell(" + ".join(cell.label for cell in together)), streaming(unit, forwards, ids) as step:
                nlls = batched_nll(model, ids, [presses[cell] for cell in together], config.chunk, step)
        except PressCannotRun:
            together = []
        for cell, nll in zip(together, nlls if together else [], strict=True):
            append_rows(store, config, streamed_as, cell, streamed.names, nll.cpu(), BATCHED)
    for cell in (cell for cell in presses if cell not in together):
        rule = nullcontext() if cell.budget is None else press_cell(cell.label)
        try:
            with rule, streaming(unit, forwards, ids) as step:
                nll = streamed_nll(model, ids, cell_press(cell, config), config.chunk, step).cpu()
        except PressCannotRun as error:
            failed(store, identity(cell, config), streamed.names, str(error))
            continue
        append_rows(store, config, streamed_as, cell, streamed.names, nll, CELL_BY_CELL)


@contextmanager
def streaming(unit: Unit, forwards: int, ids: torch.Tensor) -> Iterator[Callable[[], None]]:
    """A step bar over one stream of the texts ``ids`` in ``forwards`` forwards, and its step."""
    with active().bar(forwards, f"{unit.name}: streaming {ids.shape[0]} texts", "forward", step=True) as bar:
        yield bar.update


def missing(cell: Cell, names: list[str], store: ResultStore) -> bool:
    return any((name, cell.label, budget_key(cell.budget)) not in store for name in names)


def identity(cell: Cell, config: PerplexityConfig) -> dict:
    """The fields that name a cell's rows."""
    return {
        "press": cell.label,
        "budget": budget_key(cell.budget),
        "budget_label": budget_label(cell.budget, config.length),
    }


def cell_press(cell: Cell, config: PerplexityConfig) -> BasePress | None:
    """The ``DecodingPress`` a cell streams under (None: the full cache)."""
    if cell.budget is None:
        return None
    return budget_press(cell.press, config.chunk, int(cell.budget.value))


def budget_press(press: ResolvedPress, chunk: int, budget: int) -> BasePress:
    """The ``DecodingPress`` of ``press`` holding ``budget`` tokens, evicting every ``chunk`` tokens."""
    return decoding_press(base_press(press, chunk)[0], budget)


def streamed_presses(
    model: PreTrainedModel, ids: torch.Tensor, specs: list[str], budget: int, chunk: int, batched: bool
) -> torch.Tensor:
    """Each press of ``specs`` at ``budget`` tokens streaming the texts ``ids`` (texts, length): its NLL of every
    token after the first (presses, texts, length - 1), all in one batch (``batched_nll``, a run's default) or each
    as a batch of its own (``--cells-one-at-a-time``). A public entry point: benchmarks/streaming.py times both."""
    presses = [budget_press(resolve_press(spec), chunk, budget) for spec in specs]
    if batched:
        return torch.stack(batched_nll(model, ids, presses, chunk))
    return torch.stack([streamed_nll(model, ids, press, chunk) for press in presses])


def append_rows(
    store: ResultStore,
    config: PerplexityConfig,
    streamed_as: dict[str, str],
    cell: Cell,
    names: list[str],
    nll: torch.Tensor,
    path: str,
) -> None:
    """A row per text of the cell's NLLs ``nll`` (texts, length - 1), streamed on ``path``."""
    for name, row_nll in zip(names, nll, strict=True):
        mean = float(row_nll.mean())
        row: PerplexityRow = {
            **identity(cell, config),
            "text": name,
            "tokens": config.length,
            "nll": mean,
            "score": mean,
            "nll_by_position": [float(w.mean()) for w in row_nll.split(POSITION_WINDOW)],
            "form": config.form,
            "streamed_as": streamed_as.get(cell.label, ""),
            "path": path,
        }
        store.append(row)


def failed(store: ResultStore, common: dict, names: list[str], reason: str) -> None:
    """The cell's failed rows, one per text: its identity and the reason."""
    for name in names:
        store.append({**common, "text": name, "score": None, "error": reason})


def write_scorecard(protocol: Perplexity, config: PerplexityConfig, rows: list[dict]) -> None:
    if rows:
        labels = [budget_label(budget, config.length) for budget in config.budgets]
        write_perplexity_card(
            protocol.benchmark, config.output, rows, config.presses, labels, config.form, POSITION_WINDOW
        )


class PerplexityWork(Implementation[PerplexityConfig]):
    def dry_run(self, protocol: Perplexity, config: PerplexityConfig) -> str:
        return dry_run(protocol, config)

    def plan(self, protocol: Perplexity, config: PerplexityConfig) -> Plan:
        return plan(protocol, config)

    def write_scorecard(self, protocol: Perplexity, config: PerplexityConfig, rows: list[dict]) -> None:
        write_scorecard(protocol, config, rows)


PERPLEXITY_WORK = PerplexityWork()
implement(Perplexity, PERPLEXITY_WORK)
