"""The LongBench protocol's work: its cells checked, its plan and dry run, and its scorecard."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pandas as pd
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evaluation.catalogue.budgets import Cell, budget_label, press_cells
from evaluation.catalogue.resolved import ResolvedPress, fetch_notes, resolve_presses
from evaluation.errors import EvaluationError
from evaluation.protocols.longbench import cells
from evaluation.protocols.longbench.config import LongBenchConfig
from evaluation.protocols.longbench.data import (
    CONFIG_FILES,
    TaskConfig,
    check_tasks,
    load_configs,
    load_task,
    local_data_dir,
    resolve_data_dir,
    what_a_run_downloads,
)
from evaluation.protocols.longbench.degeneracy import degeneracy_lines
from evaluation.protocols.longbench.protocol import LongBench
from evaluation.protocols.options import PATHS
from evaluation.protocols.protocol import REFERENCE, Implementation, Plan, implement
from evaluation.protocols.single_turn import cells as single_turn
from evaluation.protocols.single_turn.cells import Case
from evaluation.protocols.single_turn.room import check_room
from evaluation.reporting.conditions import ANSWER_NLL
from evaluation.reporting.overlap import overlap_section
from evaluation.reporting.scorecard import press_contrast_table, scores_frame, summarize
from evaluation.reporting.scorecard import write_scorecard as write_card
from evaluation.runs.backends import Unit
from evaluation.runs.models import what_loading_fetches
from evaluation.runs.record import fingerprint


def with_average(summary: pd.DataFrame) -> pd.DataFrame:
    """With several tasks, a row per (metric, budget, press) holding the mean of its task means (where it has them
    all); it is no comparison and no tally."""
    tasks = summary["condition"].nunique()
    if tasks < 2:
        return summary
    groups = summary.groupby(["metric", "budget", "press"], sort=False)
    means = groups.agg(
        mean=("mean", "mean"),
        n=("n", "sum"),
        failed=("failed", "sum"),
        tasks=("mean", "count"),
        digits=("digits", "first"),
    )
    means = means[means.pop("tasks") == tasks].reset_index()
    unjudged = {column: "-" for column in summary if column.endswith("verdict")}
    return pd.concat([summary, means.assign(condition="average", tallied=False, **unjudged)], ignore_index=True)


def checked_cells(config: LongBenchConfig, dry_run: bool = False) -> list[Cell]:
    """The settings checked, before any data: the grid's cells (a dry run imports no press)."""
    check_tasks(config.tasks)
    presses = resolve_presses(config.presses, config.allow_import, dry_run, config.model.name)
    if config.path not in PATHS:
        raise EvaluationError(f"unknown path {config.path!r}; choose one of {', '.join(PATHS)}")
    return press_cells(presses, config.budgets, "--ratios or --budgets")


def dry_run(protocol: LongBench, config: LongBenchConfig) -> str:
    grid = checked_cells(config, dry_run=True)
    data_dir = local_data_dir(config.data_dir, config.tasks)
    known, answer_tokens, fetched = None, None, [what_a_run_downloads(config.tasks)]
    official: dict[str, int] | None = None
    if data_dir is not None:
        task_configs = load_configs(data_dir, config.tasks)
        check_rooms(config, task_configs)
        examples = [example for task in config.tasks for example in load_task(data_dir, task, config.n)]
        known = len(examples)
        official = official_lengths(task_configs)
        answer_tokens, fetched = sum(config.generation_cap(official[e.task]) for e in examples), []
    bound = known if known is not None else config.n * len(config.tasks) if config.n else None
    shared = [cell for cell in grid if config.path == "shared" and cell.press.shares_prefill]
    alone = len(grid) - len(shared)

    def times(k: int) -> str:
        return f"{k} per example" if bound is None else f"{'' if known is not None else 'at most '}{bound * k}"

    count = "every" if bound is None else times(1)
    lines = [
        f"LongBench: {count} examples ({', '.join(config.tasks)}) x {len(grid)} cells = {times(len(grid))} "
        f"cells, model {config.model.label}",
        *(f"  {cell.label} @ {budget_label(cell.budget)}{path_note(cell.press, cell in shared)}" for cell in grid),
        f"prefills: {times(bool(shared) + alone)} ({count} shared by {len(shared)} cells each, "
        f"{times(alone)} per cell)",
        f"decodes: {times(len(grid))} ({count} batches of {len(shared)} caches, {times(alone)} alone)"
        + (f", at most {answer_tokens * len(grid)} answer tokens" if answer_tokens is not None else "")
        if not config.likelihood_only
        else "decodes: none (--likelihood-only: each cell's gold answer forced in one forward)",
        *([departure] if (departure := departure_note(config, official)) else []),
    ]
    fetched += [what_loading_fetches(config.model.name), *fetch_notes([cell.press for cell in grid], config.model.name)]
    lines += [f"a real run first fetches: {item}" for item in fetched if item] or ["everything it reads is local"]
    return "\n".join(lines)


def check_rooms(config: LongBenchConfig, task_configs: dict[str, TaskConfig]) -> None:
    """Before any model loads: every task's ``cells.room``, in the model's context as its files say it."""
    check_room(config.model.name, [cells.room(config, task, task_config) for task, task_config in task_configs.items()])


def official_lengths(task_configs: dict[str, TaskConfig]) -> dict[str, int]:
    """Each task's official answer length (dataset2maxlen)."""
    return {task: task_config.max_new_tokens for task, task_config in task_configs.items()}


def departure_note(config: LongBenchConfig, official: dict[str, int] | None) -> str:
    """What ``--max-new-tokens`` changes of LongBench's protocol, "" where it changes nothing; ``official``: each
    task's answer length (dataset2maxlen), None when the data is not local yet."""
    cap = config.max_new_tokens
    if cap is None or config.likelihood_only:
        return ""
    if official is None:
        shorter = "below the official answer length of every task whose length is longer"
    else:
        cut = {task: length for task, length in official.items() if length > cap}
        if not cut:
            return ""
        lengths = ", ".join(f"{task} {length}" for task, length in cut.items())
        shorter = f"below the official answer length ({lengths})"
    return (
        f"Departure from LongBench's protocol: generation capped at {cap} tokens (--max-new-tokens), {shorter}; "
        "the answer likelihood keeps the official length"
    )


def path_note(press: ResolvedPress, shared: bool) -> str:
    """How a dry run's press runs, after its name: nothing on the shared path, else the per-cell path, or what a
    real run imports."""
    if shared:
        return ""
    return f" ({press.describe()})" if press.dry else " (per-cell path)"


def plan(protocol: LongBench, config: LongBenchConfig) -> Plan:
    grid = checked_cells(config)
    data_dir = resolve_data_dir(config.data_dir, config.tasks)
    task_configs = load_configs(data_dir, config.tasks)
    check_rooms(config, task_configs)
    examples = [example for task in config.tasks for example in load_task(data_dir, task, config.n)]
    files = [data_dir / f"{task}.jsonl" for task in config.tasks]
    files += [data_dir / "config" / name for name in CONFIG_FILES]
    engine = config.path == "shared"
    units = [Unit(f"{e.task}/{e.id}", e, frozenset(single_turn.cell_key(e, cell) for cell in grid)) for e in examples]
    settings = {
        "data_dir": str(data_dir),
        "budgets": [b.key for b in config.budgets],
        "data_fingerprint": fingerprint(*files),
        "paths": single_turn.path_records(config.presses, grid, engine),
    }
    work = partial(cells.run_example, config=config, task_configs=task_configs, cells=grid)
    official = official_lengths(task_configs)
    tokens = sum(config.generation_cap(official[e.task]) for e in examples) * len(grid)
    summary = f"{len(examples)} examples x {len(grid)} cells = {len(examples) * len(grid)} cells, " + (
        f"at most {tokens:,} tokens to decode" if not config.likelihood_only else "no decoding (--likelihood-only)"
    )
    departure = departure_note(config, official)
    return Plan(units, work, settings, ("data_fingerprint",), summary + (f"; {departure}" if departure else ""))


def cases(config: LongBenchConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[Case]:
    """Each example of the run (the first ``n`` of each task) as its case, cut as a run cuts it. A public entry
    point, with ``case_rows``: benchmarks/ time a case's cells."""
    data_dir = resolve_data_dir(config.data_dir, config.tasks)
    task_configs = load_configs(data_dir, config.tasks)
    budgets = {task: cells.prompt_budget(config, model, tokenizer, task, task_configs[task]) for task in config.tasks}
    return [
        cells.case_of(example, task_configs[task], tokenizer, budgets[task], config.query_aware)
        for task in config.tasks
        for example in load_task(data_dir, task, config.n)
    ]


def case_rows(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: LongBenchConfig, case: Case, grid: list[Cell]
) -> list[dict]:
    """The rows of ``grid``'s cells of one case on the configuration's path, as a run computes them."""
    return list(single_turn.run_cells(model, tokenizer, config, case, grid))


def write_scorecard(protocol: LongBench, config: LongBenchConfig, rows: list[dict]) -> None:
    if not rows:
        return
    output = config.output
    data_dir = resolve_data_dir(config.data_dir, config.tasks)
    task_configs = load_configs(data_dir, config.tasks)
    measured = (ANSWER_NLL,) if config.likelihood_only else ()
    benchmark = replace(protocol.benchmark, measured=measured)
    frame = scores_frame(benchmark, rows)
    summary = with_average(summarize(frame, REFERENCE))
    against = press_contrast_table(frame, benchmark.press_contrasts)
    scored = "Likelihood only: the first gold answer's" if config.likelihood_only else "The official task score"
    note = (
        f"{scored}, and each metric's unit and direction above its table; each cell: mean [95% bootstrap interval "
        "over examples] (n). The full cache is repeated on every budget row; with several tasks, `average` is the "
        "mean of the task means."
    )
    official = official_lengths(task_configs)
    departure = departure_note(config, official)
    if departure:
        note += f" **{departure}.**"
    labels = [b.label for b in config.budgets]
    caps = {task: config.generation_cap(length) for task, length in official.items()}
    appendix = ([] if config.likelihood_only else degeneracy_lines(rows, caps)) + overlap_section(
        output, rows, REFERENCE, benchmark
    )
    title = f"LongBench: {output.name}"
    write_card(output, summary, title, note, REFERENCE, config.presses, labels, appendix, press_contrasts=against)


class LongBenchWork(Implementation[LongBenchConfig]):
    def dry_run(self, protocol: LongBench, config: LongBenchConfig) -> str:
        return dry_run(protocol, config)

    def plan(self, protocol: LongBench, config: LongBenchConfig) -> Plan:
        return plan(protocol, config)

    def write_scorecard(self, protocol: LongBench, config: LongBenchConfig, rows: list[dict]) -> None:
        write_scorecard(protocol, config, rows)


LONGBENCH_WORK = LongBenchWork()
implement(LongBench, LONGBENCH_WORK)
