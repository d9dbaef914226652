"""The LongBench grid: every example x press x budget, one JSON line per finished cell, resumable.

Two paths compute a cell. The shared path (default) prefills each example once with the full cache, derives
every press's cache at every budget from that one prefill (``History``) and decodes them in one batch; a
press whose score reads more than the prefill's statistics takes the per-cell path instead. The per-cell
path (``--path per-cell``, the reference) runs KVPress's prefill under the press once per cell, with eager
attention where the press needs its weights. Each row records the path that produced it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.backends import LOCAL, Backend, Unit, run_units
from evaluation.budgets import Budget, budget_key, budget_label, press_cells, ratio_for
from evaluation.errors import EvaluationError
from evaluation.generation import decode_batch, eos_ids, generate
from evaluation.history import History
from evaluation.longbench.data import Example, TaskConfig, check_tasks, load_configs, load_task, resolve_data_dir
from evaluation.longbench.prompts import STOP_AT_NEWLINE_TASKS, Prompt, build_prompt
from evaluation.metrics.longbench import sample_score
from evaluation.models import load_model_or_explain
from evaluation.press_specs import attn_implementation, check_presses, make_press
from evaluation.run_record import RunRecord
from evaluation.scorecard import Entry, entries_from_rows, plot_by_budget, with_average, write_tables
from evaluation.store import ResultStore

CHAT_MARGIN = 64  # tokens left for the chat template around a truncated prompt
RESULTS_DEFINING = ("model", "query_aware", "max_length", "device")


@dataclass
class LongBenchConfig:
    model: str
    tasks: list[str]
    presses: list[str]
    budgets: list[Budget]
    n: int | None
    query_aware: bool
    data_dir: str | None
    output: Path
    device: str = "cpu"
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
    context = min(tokenizer.model_max_length, model.config.max_position_embeddings)
    return context - task.max_new_tokens - CHAT_MARGIN


def stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: str) -> set[int]:
    newline = {tokenizer.encode("\n", add_special_tokens=False)[-1]} if task in STOP_AT_NEWLINE_TASKS else set()
    return eos_ids(model) | newline


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
) -> dict:
    prediction = tokenizer.decode(generated, skip_special_tokens=True)
    context_tokens = prompt.context_ids.shape[1]
    return {
        "task": example.task,
        "id": example.id,
        "press": press_name,
        "budget": budget_key(budget),
        "budget_label": budget_label(budget),
        "compression_ratio": ratio_for(budget, context_tokens),
        "context_tokens": context_tokens,
        "kept_tokens": kept_tokens,
        "question_tokens": prompt.question_ids.shape[1],
        "truncated": prompt.truncated,
        "query_aware": config.query_aware,
        "attn_implementation": attn_implementation(press_name) if path == "per-cell" else "sdpa",
        "path": path,
        "generated_tokens": len(generated),
        "prediction": prediction,
        "answers": example.answers,
        "all_classes": example.all_classes,
        "score": sample_score(example.task, prediction, example.answers, example.all_classes),
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
    """The per-cell reference path: KVPress's prefill under the press, then greedy decoding."""
    model.set_attn_implementation(attn_implementation(press_name))
    press = make_press(press_name, ratio_for(budget, prompt.context_ids.shape[1]))
    stop = stop_ids(model, tokenizer, example.task)
    generation = generate(model, prompt.context_ids, prompt.question_ids, press, task_config.max_new_tokens, stop)
    return cell_row(
        config, example, prompt, press_name, budget, generation.token_ids, generation.kept_tokens, "per-cell", tokenizer
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
    """The shared path for one example's cells: one full-cache prefill, each press's cache derived from it,
    one batched decode of them all. Every cell's press must be one ``History.supports``."""
    model.set_attn_implementation("sdpa")
    length = prompt.context_ids.shape[1]
    presses = [make_press(name, ratio_for(budget, length)) for name, budget in cells]
    history = History(model, frozenset({"context"}), presses)
    history.extend(prompt.context_ids[0].tolist(), "context")
    caches = [history.compress(press)[0] for press in presses]
    kept = [cache.get_seq_length() for cache in caches]
    generated = decode_batch(
        model,
        caches,
        prompt.question_ids,
        history.length,
        task_config.max_new_tokens,
        stop_ids(model, tokenizer, example.task),
        history.newest_logits,
    )
    return [
        cell_row(config, example, prompt, press_name, budget, tokens, n_kept, "shared", tokenizer)
        for (press_name, budget), tokens, n_kept in zip(cells, generated, kept, strict=True)
    ]


def shares_prefill(press_name: str) -> bool:
    return History.supports(make_press(press_name, 0.5))


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


def run(config: LongBenchConfig, backend: Backend = LOCAL) -> Path:
    """Run (or resume) the grid and write predictions, scorecard and run.json under ``config.output``."""
    check_tasks(config.tasks)
    check_presses(config.presses)
    if config.path not in PATHS:
        raise EvaluationError(f"unknown path {config.path!r}; choose one of {', '.join(PATHS)}")
    press_budgets = press_cells(config.presses, config.budgets, "--ratios or --budgets")
    data_dir = resolve_data_dir(config.data_dir)
    task_configs = load_configs(data_dir, config.tasks)
    examples = [example for task in config.tasks for example in load_task(data_dir, task, config.n)]
    settings = {**asdict(config), "output": str(config.output), "data_dir": str(data_dir)}
    settings["budgets"] = [b.key for b in config.budgets]
    record = RunRecord(config.output, settings, RESULTS_DEFINING)
    store = ResultStore(config.output / "predictions.jsonl", row_key)
    units = [Unit(f"{e.task}/{e.id}", e, frozenset(cell_key((e, *cell)) for cell in press_budgets)) for e in examples]
    work = partial(run_example, config=config, task_configs=task_configs, cells=press_budgets)
    load = partial(load_model_or_explain, config.model, device=config.device)
    outcome = run_units(units, work, load, store, backend, config.device)
    write_longbench_scorecard(config.output, store.rows, config.presses, config.budgets)
    record.finish(outcome.ran, model=config.model, device=config.device, backend=backend.kind)
    outcome.raise_failures(backend.retries)
    return config.output


def conditions(row: dict) -> list[str]:
    """The scorecard conditions a LongBench row counts in: its task."""
    return [row["task"]]


def longbench_entries(rows: list[dict]) -> list[Entry]:
    """One entry per (task, budget, press): the official task score (100 x mean) with its bootstrap interval,
    plus the average over tasks."""
    entries = entries_from_rows(rows, conditions, scale=100, digits=2)
    return with_average(entries, list(dict.fromkeys(row["task"] for row in rows)))


def write_longbench_scorecard(output: Path, rows: list[dict], presses: list[str], budgets: list[Budget]) -> None:
    if rows:
        entries, labels, metric = longbench_entries(rows), [b.label for b in budgets], "LongBench score (100 x mean)"
        write_tables(output, entries, presses, labels, f"LongBench: {output.name}", metric)
        plot_by_budget(output / "scorecard.png", entries, presses, labels, metric)
