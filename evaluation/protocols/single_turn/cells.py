"""The cells of one single-turn example (a ``Case``: LongBench's, RULER's, a KVPress dataset's), each one JSON line.

The engine's cell server (``evaluation.engine.serving``) computes them. On the shared path (default) it prefills
each example once with the full cache, builds every press's cache at every budget from that one prefill by running
the press's own hook on the stored inputs and decodes them in one batch; a press that runs forward passes of its own
(``evaluation.catalogue``) takes its own prefill instead. On the per-cell path (``--path per-cell``, the reference)
every cell runs KVPress's prefill under its press, with eager attention where the press needs its weights. Each row
records the path that produced it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Protocol

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.catalogue.budgets import Cell, budget_label
from evaluation.catalogue.registry import SHARED
from evaluation.catalogue.resolved import ResolvedPress
from evaluation.catalogue.specs import FULL_CACHE, canonical
from evaluation.engine.decoding import answer_ids_of, eos_ids
from evaluation.engine.serving import Asked, Served, Server, serve_prompt
from evaluation.errors import EvaluationError
from evaluation.protocols.longbench.prompts import Prompt
from evaluation.protocols.protocol import LIKELIHOOD, REFERENCE, lacks
from evaluation.runs.models import ModelSettings
from evaluation.runs.store import ResultStore


class CellSettings(Protocol):
    """What the cells read of a single-turn protocol's configuration."""

    model: ModelSettings
    query_aware: bool
    likelihood_only: bool
    path: str

    def generation_cap(self, official: int) -> int: ...


@dataclass(frozen=True)
class Case:
    """One example ready to run: its prompt, its gold answers and how a prediction scores. ``gold``: the answer
    text whose likelihood each cell scores (None: none), cut to ``answer_length`` tokens, the task's official
    answer length, which also caps generation; ``identity``: the example's own fields in each of its rows, failed
    ones included, after its id (a generated example's length); ``fields``: those a generated row holds after
    ``answers``."""

    task: str
    id: str
    prompt: Prompt
    answers: list[str]
    gold: str | None
    answer_length: int
    score: Callable[[str], float]
    stop_at_newline: bool = False
    identity: dict = field(default_factory=dict)
    fields: dict = field(default_factory=dict)


class Identified(Protocol):
    """An example as a cell's key names it."""

    task: str
    id: str


def cell_key(example: Identified, cell: Cell) -> tuple[str, str, str, str]:
    return example.task, example.id, cell.label, cell.budget_key


def stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, case: Case) -> set[int]:
    newline = {tokenizer.encode("\n", add_special_tokens=False)[-1]} if case.stop_at_newline else set()
    return eos_ids(model) | newline


def cell_identity(case: Case, cell: Cell, length: int) -> dict:
    """The fields that name a cell's row (its resume key and its budget's label over a ``length``-token context)."""
    return {
        "task": case.task,
        "id": case.id,
        **case.identity,
        "press": cell.label,
        "budget": cell.budget_key,
        "budget_label": budget_label(cell.budget, length),
    }


def cell_row(config: CellSettings, case: Case, served: Served, tokenizer: PreTrainedTokenizerBase) -> dict:
    """A cell's row: a failed one's reason (``failed_row``), or what it measured (``served.measures``: its kept
    set's agreement with the reference press's) and its answer's likelihood. A likelihood-only row
    (``--likelihood-only``) holds no prediction, and its score is its ``answer_nll``."""
    prompt = case.prompt
    context_tokens = prompt.context_ids.shape[1]
    if served.error:
        return failed_row(case, served, context_tokens)
    row = {
        **cell_identity(case, served.cell, context_tokens),
        "compression_ratio": served.ratio,
        "context_tokens": context_tokens,
        "kept_tokens": served.kept_tokens,
        "question_tokens": prompt.question_ids.shape[1],
        "truncated": prompt.truncated,
        "query_aware": config.query_aware,
        "attn_implementation": served.implementation,
        "path": path_name(served),
        **served.measures,
    }
    likelihood = nll_fields((served.answer_nll, served.answer_tokens))
    if config.likelihood_only:
        return {**row, "answers": case.answers, "score": served.answer_nll} | likelihood
    prediction = tokenizer.decode(served.token_ids, skip_special_tokens=True)
    return {
        **row,
        "generated_tokens": len(served.token_ids),
        "prediction": prediction,
        "answers": case.answers,
        **case.fields,
        "score": case.score(prediction),
    } | likelihood


def path_name(served: Served) -> str:
    """The path a row records, named as ``--path`` names them: ``shared`` or ``per-cell``."""
    return "shared" if served.path == SHARED else "per-cell"


def nll_fields(likelihood: tuple[float | None, int]) -> dict:
    return {"answer_nll": likelihood[0], "answer_tokens": likelihood[1]}


def gold_answer_ids(tokenizer: PreTrainedTokenizerBase, case: Case) -> list[int]:
    """The gold answer's tokens, as its likelihood forces them: the answer text alone, without special tokens, cut
    to the task's official answer length; none for an example without one."""
    return answer_ids_of(tokenizer, case.gold, case.answer_length)


def failed_row(case: Case, served: Served, length: int) -> dict:
    """A cell the press could not run on this example (too short for its window, a lag over the budget, an error
    of its own: ``press_cell``): stored with its reason, counted in the scorecard, never retried on resume."""
    return {
        **cell_identity(case, served.cell, length),
        "path": path_name(served),
        "error": served.error,
        "score": None,
    }


def asked_of(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: CellSettings, case: Case) -> Asked:
    """What the example's cells answer: its question, its gold answer, its generation cap and stop ids."""
    named = case.id if case.id.startswith(f"{case.task}/") else f"{case.task}/{case.id}"
    return Asked(
        case.prompt.question_ids,
        gold_answer_ids(tokenizer, case),
        config.generation_cap(case.answer_length),
        stop_ids(model, tokenizer, case),
        f"{case.task} {case.id}",
        config.likelihood_only,
        progress=named,
    )


def path_record(press: ResolvedPress, engine: bool) -> str:
    """How a press's cells run, in words, as run.json records it."""
    if engine and press.shares_prefill:
        return press.describe()
    return f"{press.describe() if press.decodes else 'its own prefill'} (per-cell path)"


def path_records(specs: list[str], cells: list[Cell], engine: bool) -> dict[str, str]:
    """``path_record`` of each press spec but the full cache's, as run.json records them."""
    presses = {cell.label: cell.press for cell in cells}
    return {spec: path_record(presses[canonical(spec)], engine) for spec in specs if spec != FULL_CACHE}


def run_cells(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: CellSettings,
    case: Case,
    todo: list[Cell],
) -> Iterator[dict]:
    """The rows of ``todo``'s cells of one example, on the shared path where the press and ``--path`` allow it
    (``serve_prompt``), each as soon as it is finished (a run that stops later keeps it)."""
    server = Server(model, config.model.attn_implementation, REFERENCE)
    asked = asked_of(model, tokenizer, config, case)
    for served in serve_prompt(server, case.prompt.context_ids, todo, asked, config.path == "shared"):
        yield cell_row(config, case, served, tokenizer)


def completed(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: CellSettings,
    case: Case,
    unfilled: list[Cell],
    stored: list[dict],
) -> list[dict]:
    """The ``stored`` rows of the ``unfilled`` cells, which older code left without the answer's likelihood, with
    it: each cell's cache built again on its path and the answer forced after the question, nothing generated (as
    ``--likelihood-only`` does)."""
    if not gold_answer_ids(tokenizer, case):
        return [row | nll_fields((None, 0)) for row in stored]
    forced = {}
    for row in run_cells(model, tokenizer, replace(config, likelihood_only=True), case, unfilled):
        if row.get("error"):
            raise EvaluationError(f"{case.task} {case.id} {row['press']}: no likelihood: {row['error']}")
        forced[row["press"], row["budget"]] = row["answer_nll"], row["answer_tokens"]
    return [row | nll_fields(forced[row["press"], row["budget"]]) for row in stored]


def run_case(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    store: ResultStore,
    config: CellSettings,
    case: Case,
    cells: list[Cell],
) -> None:
    """One example's missing cells, and the likelihood of those older code stored without it."""
    todo = [cell for cell in cells if cell_key(case, cell) not in store]
    unfilled = [cell for cell in cells if lacks(store.get(cell_key(case, cell)), LIKELIHOOD)]
    for row in run_cells(model, tokenizer, config, case, todo):
        store.append(row)
    if unfilled:
        stored = [store.get(cell_key(case, cell)) for cell in unfilled]
        store.amend(completed(model, tokenizer, config, case, unfilled, stored))
