"""The cells of one LongBench example, each one JSON line.

Two paths compute a cell. The shared path (default) prefills each example once with the full cache, builds
every press's cache at every budget from that one prefill by running the press's own hook on the stored inputs
(``evaluation.engine``) and decodes them in one batch; a press that runs forward passes of its own
(``evaluation.catalogue``) takes the per-cell path instead. The per-cell path (``--path per-cell``, the reference)
runs KVPress's prefill under the press once per cell, with eager attention where the press needs its weights.
Each row records the path that produced it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import replace

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.catalogue.budgets import Budget, budget_key, budget_label, ratio_for
from evaluation.catalogue.registry import question_position
from evaluation.catalogue.resolved import resolve_press, resolve_presses
from evaluation.engine.decoding import answer_ids_of, decode_batch_forced, eos_ids, generate
from evaluation.engine.history import History
from evaluation.engine.overlap import UNKNOWN, Overlap, overlaps
from evaluation.engine.retention import held_positions
from evaluation.errors import EvaluationError, PressCannotRun, press_cell
from evaluation.metrics.longbench import sample_score
from evaluation.protocols.longbench.config import LongBenchConfig
from evaluation.protocols.longbench.data import (
    Example,
    TaskConfig,
)
from evaluation.protocols.longbench.prompts import STOP_AT_NEWLINE_TASKS, Prompt, build_prompt
from evaluation.protocols.longbench.protocol import LongBenchRow
from evaluation.protocols.protocol import LIKELIHOOD, REFERENCE, lacks
from evaluation.runs.backends import Unit
from evaluation.runs.models import context_length
from evaluation.runs.progress import active
from evaluation.runs.store import ResultStore
from presses.attention import attention_implementation

CHAT_MARGIN = 64  # tokens left for the chat template around a truncated prompt


ExampleCell = tuple[Example, str, Budget | None]  # one example, one press, one budget


def cell_key(cell: ExampleCell) -> tuple[str, str, str, str]:
    example, press, budget = cell
    return example.task, example.id, press, budget_key(budget)


def prompt_budget(
    config: LongBenchConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: TaskConfig
) -> int:
    """The official truncation length: ``--max-length``, else the model's context less the answer and chat room."""
    if config.max_length is not None:
        return config.max_length
    context = context_length(tokenizer, model.config)
    return context - task.max_new_tokens - CHAT_MARGIN


def stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: str) -> set[int]:
    newline = {tokenizer.encode("\n", add_special_tokens=False)[-1]} if task in STOP_AT_NEWLINE_TASKS else set()
    return eos_ids(model) | newline


def cell_identity(example: Example, press_name: str, budget: Budget | None, length: int) -> dict:
    """The fields that name a cell's row (its resume key and its budget's label over a ``length``-token context)."""
    return {
        "task": example.task,
        "id": example.id,
        "press": press_name,
        "budget": budget_key(budget),
        "budget_label": budget_label(budget, length),
    }


def cell_row(
    config: LongBenchConfig,
    example: Example,
    prompt: Prompt,
    press_name: str,
    budget: Budget | None,
    generated: list[int],
    kept_tokens: int,
    path: str,
    tokenizer: PreTrainedTokenizerBase,
    attn_implementation: str,
    likelihood: tuple[float | None, int],
    overlap: Overlap = UNKNOWN,
) -> LongBenchRow:
    """A finished cell's row; ``likelihood``: its answer's (``answer_nll``, ``answer_tokens``); ``overlap``: its
    kept set's agreement with the reference press's (``engine.overlap``). A likelihood-only row
    (``--likelihood-only``) holds no prediction, and its score is its ``answer_nll``."""
    context_tokens = prompt.context_ids.shape[1]
    row: LongBenchRow = {
        **cell_identity(example, press_name, budget, context_tokens),
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
        return {**row, "answers": example.answers, "score": likelihood[0]} | nll_fields(likelihood)
    prediction = tokenizer.decode(generated, skip_special_tokens=True)
    return {
        **row,
        "generated_tokens": len(generated),
        "prediction": prediction,
        "answers": example.answers,
        "all_classes": example.all_classes,
        "score": sample_score(example.task, prediction, example.answers, example.all_classes),
    } | nll_fields(likelihood)


def nll_fields(likelihood: tuple[float | None, int]) -> dict:
    return {"answer_nll": likelihood[0], "answer_tokens": likelihood[1]}


def gold_answer_ids(tokenizer: PreTrainedTokenizerBase, example: Example, task_config: TaskConfig) -> list[int]:
    """The first gold answer's tokens, as its likelihood forces them: the answer text alone, without special
    tokens, cut to the task's official answer length (dataset2maxlen); none for an example without answers."""
    answer = example.answers[0] if example.answers else None
    return answer_ids_of(tokenizer, answer, task_config.max_new_tokens)


def failed_row(
    example: Example, press_name: str, budget: Budget | None, length: int, path: str, error: Exception
) -> LongBenchRow:
    """A cell the press could not run on this example (too short for its window, a lag over the budget, an error
    of its own: ``press_cell``): stored with its reason, counted in the scorecard, never retried on resume."""
    return {
        **cell_identity(example, press_name, budget, length),
        "path": path,
        "error": str(error).splitlines()[0],
        "score": None,
    }


def check_answer(config: LongBenchConfig, example: Example, answer: list[int]) -> None:
    """A likelihood-only cell needs an answer to score: an example without one fails (``PressCannotRun``)."""
    if config.likelihood_only and not answer:
        raise PressCannotRun(f"{example.task} {example.id} has no gold answer: no likelihood to score")


def run_cell(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: LongBenchConfig,
    task_config: TaskConfig,
    example: Example,
    prompt: Prompt,
    press_name: str,
    budget: Budget | None,
) -> dict:
    """The per-cell reference path: KVPress's prefill under the press (eager where it needs the weights), then
    greedy decoding; the model's attention implementation is restored afterwards. A press's error is the cell's
    failure (``press_cell``); the full-cache cell's stops the run."""
    length = prompt.context_ids.shape[1]
    resolved = resolve_press(press_name)
    implementation = "eager" if resolved.reads_weights else config.model.attn_implementation
    stop = stop_ids(model, tokenizer, example.task)
    answer = gold_answer_ids(tokenizer, example, task_config)
    cap = config.generation_cap(task_config.max_new_tokens)
    rule = nullcontext if budget is None else press_cell
    try:
        check_answer(config, example, answer)
        with rule(press_name):
            press = resolved.build(ratio_for(budget, length), length)
        with rule(press), attention_implementation(model, implementation):
            generation = generate(model, prompt.context_ids, prompt.question_ids, press, cap, stop, answer)
    except PressCannotRun as error:
        return failed_row(example, press_name, budget, length, "per-cell", error)
    tokens, kept = generation.token_ids, generation.kept_tokens
    likelihood = (generation.answer_nll, len(answer))
    return cell_row(
        config, example, prompt, press_name, budget, tokens, kept, "per-cell", tokenizer, implementation, likelihood
    )


def run_shared(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: LongBenchConfig,
    task_config: TaskConfig,
    example: Example,
    prompt: Prompt,
    cells: list[tuple[str, Budget | None]],
) -> list[dict]:
    """The shared path for one example's cells: one full-cache prefill, each press's cache built from it by the
    press's own hook, one batched decode of them all. Every cell's press must be on the shared path."""
    model.set_attn_implementation(config.model.attn_implementation)
    length = prompt.context_ids.shape[1]
    answer = gold_answer_ids(tokenizer, example, task_config)
    try:
        check_answer(config, example, answer)
    except PressCannotRun as error:
        return [failed_row(example, press_name, budget, length, "shared", error) for press_name, budget in cells]
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
            rows.append(failed_row(example, press_name, budget, length, "shared", error))
    agreement = overlaps([(name, budget_key(budget)) for name, budget, _ in derived], held, REFERENCE)
    del held
    first_logits = history.newest_logits
    for _, _, cache in derived:
        cache.owned = True  # the history is done with: the batch takes over its cache too (the full-cache cell's)
    del history
    cap = config.generation_cap(task_config.max_new_tokens)
    with active().bar(cap, f"{example.task}/{example.id}: decoding {len(derived)} caches", "token", step=True) as bar:
        generated, nlls = decode_batch_forced(
            model,
            [cache for _, _, cache in derived],
            prompt.question_ids,
            starts,
            cap,
            stop_ids(model, tokenizer, example.task),
            answer,
            first_logits,
            consume=True,
            on_step=bar.update,
        )
    return rows + [
        cell_row(
            config,
            example,
            prompt,
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
    config: LongBenchConfig,
    task_config: TaskConfig,
    example: Example,
    prompt: Prompt,
    todo: list[tuple[str, Budget | None]],
) -> Iterator[dict]:
    """The rows of ``todo``'s cells of one example, on the shared path where the press allows it, each as soon as
    it is finished (a run that stops later keeps it)."""
    engine = config.path == "shared" and History.serves(model)
    shared = [cell for cell in todo if engine and shares_prefill(cell[0])]
    if shared:
        yield from run_shared(model, tokenizer, config, task_config, example, prompt, shared)
    for press_name, budget in (cell for cell in todo if cell not in shared):
        yield run_cell(model, tokenizer, config, task_config, example, prompt, press_name, budget)


def completed(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: LongBenchConfig,
    task_config: TaskConfig,
    example: Example,
    prompt: Prompt,
    unfilled: list[tuple[str, Budget | None]],
    stored: list[dict],
) -> list[dict]:
    """The ``stored`` rows of the ``unfilled`` cells, which older code left without the answer's likelihood, with
    it: each cell's cache built again on its path and the answer forced after the question, nothing generated (as
    ``--likelihood-only`` does)."""
    if not gold_answer_ids(tokenizer, example, task_config):
        return [row | nll_fields((None, 0)) for row in stored]
    forced = {}
    for row in run_cells(
        model, tokenizer, replace(config, likelihood_only=True), task_config, example, prompt, unfilled
    ):
        if row.get("error"):
            raise EvaluationError(f"{example.task} {example.id} {row['press']}: no likelihood: {row['error']}")
        forced[row["press"], row["budget"]] = row["answer_nll"], row["answer_tokens"]
    return [row | nll_fields(forced[row["press"], row["budget"]]) for row in stored]


def run_example(
    loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    unit: Unit,
    store: ResultStore,
    config: LongBenchConfig,
    task_configs: dict[str, TaskConfig],
    cells: list[tuple[str, Budget | None]],
) -> None:
    """One unit: the missing cells of one example, and the likelihood of those older code stored without it."""
    resolve_presses(config.presses, config.allow_import)  # once per process: a Ray worker's own resolution
    model, tokenizer = loaded
    example: Example = unit.payload
    todo = [cell for cell in cells if cell_key((example, *cell)) not in store]
    unfilled = [cell for cell in cells if lacks(store.get(cell_key((example, *cell))), LIKELIHOOD)]
    task_config = task_configs[example.task]
    prompt = build_prompt(
        example, task_config, tokenizer, prompt_budget(config, model, tokenizer, task_config), config.query_aware
    )
    for row in run_cells(model, tokenizer, config, task_config, example, prompt, todo):
        store.append(row)
    if unfilled:
        stored = [store.get(cell_key((example, *cell))) for cell in unfilled]
        store.amend(completed(model, tokenizer, config, task_config, example, prompt, unfilled, stored))
