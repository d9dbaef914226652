"""The cells of one single-turn example (a ``Case``: LongBench's, RULER's, a KVPress dataset's), each one JSON line.

Two paths compute a cell. The shared path (default) prefills each example once with the full cache, builds
every press's cache at every budget from that one prefill by running the press's own hook on the stored inputs
(``evaluation.engine``) and decodes them in one batch; a press that runs forward passes of its own
(``evaluation.catalogue``) takes the per-cell path instead. The per-cell path (``--path per-cell``, the reference)
runs KVPress's prefill under the press once per cell, with eager attention where the press needs its weights.
Each row records the path that produced it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Protocol

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.catalogue.budgets import Budget, budget_key, budget_label, ratio_for
from evaluation.catalogue.registry import question_position
from evaluation.catalogue.resolved import resolve_press
from evaluation.engine.decoding import answer_ids_of, decode_batch_forced, eos_ids, generate
from evaluation.engine.history import History
from evaluation.engine.overlap import UNKNOWN, Overlap, overlaps
from evaluation.engine.retention import held_positions
from evaluation.errors import EvaluationError, PressCannotRun, press_cell
from evaluation.protocols.longbench.prompts import Prompt
from evaluation.protocols.protocol import LIKELIHOOD, REFERENCE, lacks
from evaluation.runs.models import ModelSettings
from evaluation.runs.progress import active
from evaluation.runs.store import ResultStore
from presses.harness import attention_implementation

Cell = tuple[str, Budget | None]  # one press, one budget


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


def cell_key(example: Identified, press: str, budget: Budget | None) -> tuple[str, str, str, str]:
    return example.task, example.id, press, budget_key(budget)


def stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, case: Case) -> set[int]:
    newline = {tokenizer.encode("\n", add_special_tokens=False)[-1]} if case.stop_at_newline else set()
    return eos_ids(model) | newline


def cell_identity(case: Case, press_name: str, budget: Budget | None, length: int) -> dict:
    """The fields that name a cell's row (its resume key and its budget's label over a ``length``-token context)."""
    return {
        "task": case.task,
        "id": case.id,
        **case.identity,
        "press": press_name,
        "budget": budget_key(budget),
        "budget_label": budget_label(budget, length),
    }


def cell_row(
    config: CellSettings,
    case: Case,
    press_name: str,
    budget: Budget | None,
    generated: list[int],
    kept_tokens: int,
    path: str,
    tokenizer: PreTrainedTokenizerBase,
    attn_implementation: str,
    likelihood: tuple[float | None, int],
    overlap: Overlap = UNKNOWN,
) -> dict:
    """A finished cell's row; ``likelihood``: its answer's (``answer_nll``, ``answer_tokens``); ``overlap``: its
    kept set's agreement with the reference press's (``engine.overlap``). A likelihood-only row
    (``--likelihood-only``) holds no prediction, and its score is its ``answer_nll``."""
    prompt = case.prompt
    context_tokens = prompt.context_ids.shape[1]
    row = {
        **cell_identity(case, press_name, budget, context_tokens),
        "compression_ratio": ratio_for(budget, context_tokens),
        "context_tokens": context_tokens,
        "kept_tokens": kept_tokens,
        "question_tokens": prompt.question_ids.shape[1],
        "truncated": prompt.truncated,
        "query_aware": config.query_aware,
        "attn_implementation": attn_implementation,
        "path": path,
        **overlap,
    }
    if config.likelihood_only:
        return {**row, "answers": case.answers, "score": likelihood[0]} | nll_fields(likelihood)
    prediction = tokenizer.decode(generated, skip_special_tokens=True)
    return {
        **row,
        "generated_tokens": len(generated),
        "prediction": prediction,
        "answers": case.answers,
        **case.fields,
        "score": case.score(prediction),
    } | nll_fields(likelihood)


def nll_fields(likelihood: tuple[float | None, int]) -> dict:
    return {"answer_nll": likelihood[0], "answer_tokens": likelihood[1]}


def gold_answer_ids(tokenizer: PreTrainedTokenizerBase, case: Case) -> list[int]:
    """The gold answer's tokens, as its likelihood forces them: the answer text alone, without special tokens, cut
    to the task's official answer length; none for an example without one."""
    return answer_ids_of(tokenizer, case.gold, case.answer_length)


def failed_row(case: Case, press_name: str, budget: Budget | None, length: int, path: str, error: Exception) -> dict:
    """A cell the press could not run on this example (too short for its window, a lag over the budget, an error
    of its own: ``press_cell``): stored with its reason, counted in the scorecard, never retried on resume."""
    return {
        **cell_identity(case, press_name, budget, length),
        "path": path,
        "error": str(error).splitlines()[0],
        "score": None,
    }


def check_answer(config: CellSettings, case: Case, answer: list[int]) -> None:
    """A likelihood-only cell needs an answer to score: an example without one fails (``PressCannotRun``)."""
    if config.likelihood_only and not answer:
        raise PressCannotRun(f"{case.task} {case.id} has no gold answer: no likelihood to score")


def run_cell(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: CellSettings,
    case: Case,
    press_name: str,
    budget: Budget | None,
) -> dict:
    """The per-cell reference path: KVPress's prefill under the press (eager where it needs the weights), then
    greedy decoding; the model's attention implementation is restored afterwards. A press's error is the cell's
    failure (``press_cell``); the full-cache cell's stops the run."""
    prompt = case.prompt
    length = prompt.context_ids.shape[1]
    resolved = resolve_press(press_name)
    implementation = "eager" if resolved.reads_weights else config.model.attn_implementation
    stop = stop_ids(model, tokenizer, case)
    answer = gold_answer_ids(tokenizer, case)
    cap = config.generation_cap(case.answer_length)
    rule = nullcontext if budget is None else press_cell
    try:
        check_answer(config, case, answer)
        with rule(press_name):
            press = resolved.build(ratio_for(budget, length), length)
        with rule(press), attention_implementation(model, implementation):
            generation = generate(model, prompt.context_ids, prompt.question_ids, press, cap, stop, answer)
    except PressCannotRun as error:
        return failed_row(case, press_name, budget, length, "per-cell", error)
    tokens, kept = generation.token_ids, generation.kept_tokens
    likelihood = (generation.answer_nll, len(answer))
    return cell_row(config, case, press_name, budget, tokens, kept, "per-cell", tokenizer, implementation, likelihood)


def run_shared(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: CellSettings,
    case: Case,
    cells: list[Cell],
) -> list[dict]:
    """The shared path for one example's cells: one full-cache prefill, each press's cache built from it by the
    press's own hook, one batched decode of them all. Every cell's press must be on the shared path."""
    model.set_attn_implementation(config.model.attn_implementation)
    prompt = case.prompt
    length = prompt.context_ids.shape[1]
    answer = gold_answer_ids(tokenizer, case)
    try:
        check_answer(config, case, answer)
    except PressCannotRun as error:
        return [failed_row(case, press_name, budget, length, "shared", error) for press_name, budget in cells]
    history = History(model, frozenset({"context"}), [resolve_press(name).needs for name, _ in cells])
    history.extend(prompt.context_ids[0].tolist(), "context")
    rows, derived, starts, held = [], [], [], []
    for press_name, budget in cells:
        rule = nullcontext if budget is None else press_cell
        try:
            with rule(press_name):
                press = resolve_press(press_name).build(ratio_for(budget, length), length)
            with rule(press):
                derived.append((press_name, budget, history.compress(press)))
            starts.append(question_position(press, length, derived[-1][2].cache.get_seq_length()))
            held.append(held_positions(history.cache, derived[-1][2]))
        except PressCannotRun as error:
            rows.append(failed_row(case, press_name, budget, length, "shared", error))
    agreement = overlaps([(name, budget_key(budget)) for name, budget, _ in derived], held, REFERENCE)
    del held
    first_logits = history.newest_logits
    for _, _, cache in derived:
        cache.owned = True  # the history is done with: the batch takes over its cache too (the full-cache cell's)
    del history
    cap = config.generation_cap(case.answer_length)
    named = case.id if case.id.startswith(f"{case.task}/") else f"{case.task}/{case.id}"
    with active().bar(cap, f"{named}: decoding {len(derived)} caches", "token", step=True) as bar:
        generated, nlls = decode_batch_forced(
            model,
            [cache for _, _, cache in derived],
            prompt.question_ids,
            starts,
            cap,
            stop_ids(model, tokenizer, case),
            answer,
            first_logits,
            consume=True,
            on_step=bar.update,
        )
    return rows + [
        cell_row(
            config,
            case,
            press_name,
            budget,
            tokens,
            cache.kept_tokens,
            "shared",
            tokenizer,
            config.model.attn_implementation,
            (nll, len(answer)),
            overlap,
        )
        for (press_name, budget, cache), tokens, nll, overlap in zip(derived, generated, nlls, agreement, strict=True)
    ]


def shares_prefill(press_name: str) -> bool:
    return resolve_press(press_name).shares_prefill


def path_record(press_name: str, engine: bool) -> str:
    """How a press's cells run, in words, as run.json records it."""
    press = resolve_press(press_name)
    if engine and press.shares_prefill:
        return press.describe()
    return f"{press.describe() if press.decodes else 'its own prefill'} (per-cell path)"


def run_cells(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: CellSettings,
    case: Case,
    todo: list[Cell],
) -> Iterator[dict]:
    """The rows of ``todo``'s cells of one example, on the shared path where the press allows it, each as soon as
    it is finished (a run that stops later keeps it)."""
    engine = config.path == "shared" and History.serves(model)
    shared = [cell for cell in todo if engine and shares_prefill(cell[0])]
    if shared:
        yield from run_shared(model, tokenizer, config, case, shared)
    for press_name, budget in (cell for cell in todo if cell not in shared):
        yield run_cell(model, tokenizer, config, case, press_name, budget)


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
    todo = [cell for cell in cells if cell_key(case, *cell) not in store]
    unfilled = [cell for cell in cells if lacks(store.get(cell_key(case, *cell)), LIKELIHOOD)]
    for row in run_cells(model, tokenizer, config, case, todo):
        store.append(row)
    if unfilled:
        stored = [store.get(cell_key(case, *cell)) for cell in unfilled]
        store.amend(completed(model, tokenizer, config, case, unfilled, stored))
