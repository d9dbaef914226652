"""The LongBench grid: every example x press x budget, one JSON line per finished cell, resumable.

Two paths compute a cell. The shared path (default) prefills each example once with the full cache, builds
every press's cache at every budget from that one prefill by running the press's own hook on the stored inputs
(``evaluation.engine``) and decodes them in one batch; a press that runs forward passes of its own
(``press_needs``) takes the per-cell path instead. The per-cell path (``--path per-cell``, the reference) runs
KVPress's prefill under the press once per cell, with eager attention where the press needs its weights. Each
row records the path that produced it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import pandas as pd
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.catalogue.budgets import Budget, Cell, budget_key, budget_label, press_cells, ratio_for
from evaluation.catalogue.registry import question_position
from evaluation.catalogue.resolved import resolve_press, resolve_presses
from evaluation.catalogue.specs import FULL_CACHE
from evaluation.engine.decoding import decode_batch, eos_ids, generate
from evaluation.engine.history import History
from evaluation.errors import EvaluationError, PressCannotRun
from evaluation.metrics.longbench import sample_score
from evaluation.protocols.longbench.data import (
    CONFIG_FILES,
    Example,
    TaskConfig,
    check_tasks,
    load_configs,
    load_task,
    local_data_dir,
    resolve_data_dir,
    what_a_run_downloads,
)
from evaluation.protocols.longbench.degeneracy import degeneracy_lines
from evaluation.protocols.longbench.prompts import STOP_AT_NEWLINE_TASKS, Prompt, build_prompt
from evaluation.reporting.conditions import Benchmark
from evaluation.reporting.scorecard import scores_frame, summarize, write_scorecard
from evaluation.runs.backends import LOCAL, Backend, Unit, run_units
from evaluation.runs.models import ModelSettings, context_length, what_loading_fetches
from evaluation.runs.record import RunRecord, fingerprint
from evaluation.runs.store import ResultStore

CHAT_MARGIN = 64  # tokens left for the chat template around a truncated prompt
RESULTS_DEFINING = ("model", "dtype", "attn_implementation", "device", "query_aware", "max_length", "data_fingerprint")


@dataclass
class LongBenchConfig:
    model: ModelSettings
    tasks: list[str]
    presses: list[str]
    budgets: list[Budget]
    n: int | None
    query_aware: bool
    data_dir: str | None
    output: Path
    max_length: int | None = None
    path: str = "shared"


ExampleCell = tuple[Example, str, Budget | None]  # one example, one press, one budget
PATHS = ("shared", "per-cell")


def row_key(row: dict) -> tuple[str, str, str, str]:
    return row["task"], row["id"], row["press"], row["budget"]


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
) -> dict:
    prediction = tokenizer.decode(generated, skip_special_tokens=True)
    context_tokens = prompt.context_ids.shape[1]
    return {
        **cell_identity(example, press_name, budget, context_tokens),
        "compression_ratio": ratio_for(budget, context_tokens),
        "context_tokens": context_tokens,
        "kept_tokens": kept_tokens,
        "question_tokens": prompt.question_ids.shape[1],
        "truncated": prompt.truncated,
        "query_aware": config.query_aware,
        "attn_implementation": attn_implementation,
        "path": path,
        "generated_tokens": len(generated),
        "prediction": prediction,
        "answers": example.answers,
        "all_classes": example.all_classes,
        "score": sample_score(example.task, prediction, example.answers, example.all_classes),
    }


def failed_row(
    example: Example, press_name: str, budget: Budget | None, length: int, path: str, error: Exception
) -> dict:
    """A cell the press could not run on this example (too short for its window, a lag over the budget...):
    stored with its reason, counted in the scorecard, never retried on resume."""
    return {
        **cell_identity(example, press_name, budget, length),
        "path": path,
        "error": str(error).splitlines()[0],
        "score": None,
    }


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
    greedy decoding."""
    length = prompt.context_ids.shape[1]
    resolved = resolve_press(press_name)
    press = resolved.build(ratio_for(budget, length), length)
    implementation = "eager" if resolved.reads_weights else config.model.attn_implementation
    model.set_attn_implementation(implementation)
    stop = stop_ids(model, tokenizer, example.task)
    try:
        generation = generate(model, prompt.context_ids, prompt.question_ids, press, task_config.max_new_tokens, stop)
    except PressCannotRun as error:
        return failed_row(example, press_name, budget, length, "per-cell", error)
    tokens, kept = generation.token_ids, generation.kept_tokens
    return cell_row(config, example, prompt, press_name, budget, tokens, kept, "per-cell", tokenizer, implementation)


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
    presses = [resolve_press(name).build(ratio_for(budget, length), length) for name, budget in cells]
    history = History(model, frozenset({"context"}), presses)
    history.extend(prompt.context_ids[0].tolist(), "context")
    rows, derived, starts = [], [], []
    for press_name, budget in cells:
        press = presses.pop(0)  # once its cache is built, nothing it holds is needed while decoding
        try:
            derived.append((press_name, budget, history.compress(press)))
            starts.append(question_position(press, length, derived[-1][2].cache.get_seq_length()))
        except PressCannotRun as error:
            rows.append(failed_row(example, press_name, budget, length, "shared", error))
    first_logits = history.newest_logits
    for _, _, cache in derived:
        cache.owned = True  # the history is done with: the batch takes over its cache too (the full-cache cell's)
    del history
    generated = decode_batch(
        model,
        [cache for _, _, cache in derived],
        prompt.question_ids,
        starts,
        task_config.max_new_tokens,
        stop_ids(model, tokenizer, example.task),
        first_logits,
        consume=True,
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
        )
        for (press_name, budget, cache), tokens in zip(derived, generated, strict=True)
    ]


def shares_prefill(press_name: str) -> bool:
    return resolve_press(press_name).shares_prefill


def path_record(press_name: str, engine: bool) -> str:
    """How a press's cells run, in words, as run.json records it."""
    press = resolve_press(press_name)
    if engine and press.shares_prefill:
        return press.describe()
    return f"{press.describe() if press.decodes else 'its own prefill'} (per-cell path)"


def run_example(
    loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    unit: Unit,
    store: ResultStore,
    config: LongBenchConfig,
    task_configs: dict[str, TaskConfig],
    cells: list[tuple[str, Budget | None]],
) -> None:
    """One unit: the missing cells of one example, on the shared path where the press allows it."""
    model, tokenizer = loaded
    example: Example = unit.payload
    todo = [cell for cell in cells if cell_key((example, *cell)) not in store]
    task_config = task_configs[example.task]
    prompt = build_prompt(
        example, task_config, tokenizer, prompt_budget(config, model, tokenizer, task_config), config.query_aware
    )
    engine = config.path == "shared" and History.serves(model)
    shared = [cell for cell in todo if engine and shares_prefill(cell[0])]
    if shared:
        for row in run_shared(model, tokenizer, config, task_config, example, prompt, shared):
            store.append(row)
    for press_name, budget in (cell for cell in todo if cell not in shared):
        store.append(run_cell(model, tokenizer, config, task_config, example, prompt, press_name, budget))


def checked_cells(config: LongBenchConfig) -> list[Cell]:
    """The settings checked, before any data: the grid's cells."""
    check_tasks(config.tasks)
    presses = resolve_presses(config.presses)
    if config.path not in PATHS:
        raise EvaluationError(f"unknown path {config.path!r}; choose one of {', '.join(PATHS)}")
    return press_cells(presses, config.budgets, "--ratios or --budgets")


def prepare(config: LongBenchConfig) -> tuple[Path, dict[str, TaskConfig], list[Example], list[Cell]]:
    """Everything a run reads before the model: checked settings, the data, the task configs and the cells."""
    cells = checked_cells(config)
    data_dir = resolve_data_dir(config.data_dir, config.tasks)
    task_configs = load_configs(data_dir, config.tasks)
    examples = [example for task in config.tasks for example in load_task(data_dir, task, config.n)]
    return data_dir, task_configs, examples, cells


def dry_run(config: LongBenchConfig) -> str:
    """The grid and the work it takes, without a model, the network or a file written: where the data or the
    model is not local, what a real run would fetch."""
    cells = checked_cells(config)
    data_dir = local_data_dir(config.data_dir, config.tasks)
    known, answer_tokens, fetched = None, None, [what_a_run_downloads(config.tasks)]
    if data_dir is not None:
        task_configs = load_configs(data_dir, config.tasks)
        examples = [example for task in config.tasks for example in load_task(data_dir, task, config.n)]
        known, answer_tokens, fetched = len(examples), sum(task_configs[e.task].max_new_tokens for e in examples), []
    bound = known if known is not None else config.n * len(config.tasks) if config.n else None
    shared = [cell for cell in cells if config.path == "shared" and shares_prefill(cell[0])]
    alone = len(cells) - len(shared)

    def times(k: int) -> str:
        return f"{k} per example" if bound is None else f"{'' if known is not None else 'at most '}{bound * k}"

    count = "every" if bound is None else times(1)
    lines = [
        f"LongBench: {count} examples ({', '.join(config.tasks)}) x {len(cells)} cells = {times(len(cells))} cells, "
        f"model {config.model.label}",
        *(
            f"  {press} @ {budget_label(budget)}" + ("" if (press, budget) in shared else " (per-cell path)")
            for press, budget in cells
        ),
        f"prefills: {times(bool(shared) + alone)} ({count} shared by {len(shared)} cells each, "
        f"{times(alone)} per cell)",
        f"decodes: {times(len(cells))} ({count} batches of {len(shared)} caches, {times(alone)} alone)"
        + (f", at most {answer_tokens * len(cells)} answer tokens" if answer_tokens is not None else ""),
    ]
    fetched += [what_loading_fetches(config.model.name)]
    lines += [f"a real run first fetches: {item}" for item in fetched if item] or ["everything it reads is local"]
    return "\n".join(lines)


def run(config: LongBenchConfig, backend: Backend = LOCAL) -> Path:
    """Run (or resume) the grid and write predictions, scorecard and run.json under ``config.output``."""
    data_dir, task_configs, examples, press_budgets = prepare(config)
    settings = {**asdict(config), **config.model.record(), "output": str(config.output), "data_dir": str(data_dir)}
    settings["budgets"] = [b.key for b in config.budgets]
    files = [data_dir / f"{task}.jsonl" for task in config.tasks] + [data_dir / "config" / n for n in CONFIG_FILES]
    settings["data_fingerprint"] = fingerprint(*files)
    engine = config.path == "shared"
    settings["paths"] = {p: path_record(p, engine) for p in config.presses if p != FULL_CACHE}
    record = RunRecord(config.output, settings, RESULTS_DEFINING, ModelSettings().record(), protocol=PROTOCOL)
    store = ResultStore(config.output / "predictions.jsonl", row_key)
    units = [Unit(f"{e.task}/{e.id}", e, frozenset(cell_key((e, *cell)) for cell in press_budgets)) for e in examples]
    work = partial(run_example, config=config, task_configs=task_configs, cells=press_budgets)
    outcome = run_units(units, work, config.model, store, backend)
    write_longbench_scorecard(config.output, store.rows, config.presses, config.budgets, task_configs)
    record.finish(outcome, backend=backend.kind)
    outcome.raise_failures(backend.retries)
    return config.output


def conditions(row: dict) -> list[str]:
    """The scorecard conditions a LongBench row counts in: its task."""
    return [row["task"]]


BENCHMARK = Benchmark("LongBench", conditions, lambda row: (row["task"], row["id"]), 100, 2)
REFERENCE = "h2o"
PROTOCOL = "longbench"


def with_average(summary: pd.DataFrame) -> pd.DataFrame:
    """With several tasks, a row per (budget, press) holding the mean of its task scores (where it has them all)."""
    tasks = summary["condition"].nunique()
    if tasks < 2:
        return summary
    groups = summary.groupby(["budget", "press"], sort=False)
    means = groups.agg(mean=("mean", "mean"), n=("n", "sum"), failed=("failed", "sum"), tasks=("mean", "count"))
    means = means[means.pop("tasks") == tasks].reset_index()
    return pd.concat(
        [summary, means.assign(condition="average", digits=2, verdict="-", full_verdict="-")], ignore_index=True
    )


def write_longbench_scorecard(
    output: Path, rows: list[dict], presses: list[str], budgets: list[Budget], task_configs: dict[str, TaskConfig]
) -> None:
    if rows:
        summary = with_average(summarize(scores_frame(BENCHMARK, rows), REFERENCE))
        note = (
            "The official task score (100 x mean); each cell: mean [95% bootstrap interval over examples] (n). "
            "The full cache is repeated on every budget row; with several tasks, `average` is the mean of the "
            "task scores."
        )
        labels = [b.label for b in budgets]
        caps = {task: task_config.max_new_tokens for task, task_config in task_configs.items()}
        appendix = degeneracy_lines(rows, caps)
        write_scorecard(output, summary, f"LongBench: {output.name}", note, REFERENCE, presses, labels, appendix)
