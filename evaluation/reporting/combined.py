"""One scorecard across benchmarks (``python -m evaluation scorecard``): every (condition, budget, press) of any
mix of runs, each through its protocol's own ``Benchmark`` and metrics, with a 95% bootstrap interval over examples,
in a table per benchmark with the presses that ran there (runs of one protocol pooled where they agree on how
scores are computed and share no example, else a table each, named by their folders); against a reference press
the paired difference, its verdict (win, tie: the interval contains 0, loss), the verdict after Holm's correction
and the smallest difference each comparison could detect, and the wins / ties / losses per press (each example
counted once), as in the paper's Figure 3, per metric; then the contrasts each benchmark declares. A press name is
its spec, so one name is one press in every run; a run's benchmark is the protocol its run.json records; a folder
given twice, runs of two models, and rows of a press or budget their run did not ask for, are refused."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from evaluation.catalogue.budgets import Budget
from evaluation.catalogue.specs import FULL_CACHE
from evaluation.errors import EvaluationError
from evaluation.reporting.conditions import Benchmark
from evaluation.reporting.scorecard import (
    contrast_table,
    press_contrast_table,
    scores_frame,
    summarize,
    with_holm,
    write_scorecard,
)
from evaluation.runs.files import SCORECARD_FILES, refuse_links, refuse_run_folder
from evaluation.runs.json_rows import numbered_rows
from evaluation.runs.record import read_record


@dataclass(frozen=True)
class Pool:
    """Runs of one protocol pooled into one table: their benchmark, rows and folders, and the table's title (the
    benchmark's name, with its runs' folders where the benchmark has several pools)."""

    title: str
    benchmark: Benchmark
    rows: list[dict]
    runs: tuple[Path, ...]

    @property
    def prefix(self) -> str:
        return f"{self.title} "


def load_runs(
    run_dirs: list[Path], benchmarks: dict[str, Benchmark], pooled: dict[str, list[str]] | None = None
) -> tuple[list[Pool], list[str]]:
    """The runs pooled (each folder once, all of one model: name and precision), and those whose last session has
    not finished (still running, or cut off): their rows so far. Runs of one protocol pool where they agree on
    every setting of how scores are computed and hold no example in common (``pooling``); ``pooled``: each
    protocol's such settings, for a run.json that does not name them."""
    seen = [run.resolve() for run in run_dirs]
    twice = sorted({str(run) for run in seen if seen.count(run) > 1})
    if twice:
        raise EvaluationError(f"run {', '.join(twice)} is given twice: its examples would count twice")
    loaded = [load_run(run, benchmarks) for run in run_dirs]
    records = {run: record for run, (_, _, record) in zip(run_dirs, loaded, strict=True)}
    models = {run: (str(r["config"].get("model")), str(r["config"].get("dtype"))) for run, r in records.items()}
    if len(set(models.values())) > 1:
        listed = "; ".join(f"{run}: {' '.join(model)}" for run, model in models.items())
        raise EvaluationError(f"the runs are of different models ({listed}): pool the runs of one model")
    partial = [str(run) for run, record in records.items() if not finished(record)]
    runs = [(run, benchmark, rows, record) for run, (benchmark, rows, record) in zip(run_dirs, loaded, strict=True)]
    return pooling(runs, pooled or {}), partial


def finished(record: dict) -> bool:
    """Whether a run's last session finished (False while it runs, or after it was cut off)."""
    return bool(record["sessions"]) and bool(record["sessions"][-1].get("finished"))


def pooling(runs: list[tuple[Path, Benchmark, list[dict], dict]], pooled: dict[str, list[str]]) -> list[Pool]:
    """The runs in pools, in the order given: a run joins the first pool of its protocol whose runs agree with it on
    every setting of how scores are computed that both record (what its run.json names ``pooled_settings``, else
    ``pooled``'s of its protocol) and hold none of its examples; any other opens a pool of its own."""
    groups: list[tuple[str, Benchmark, list[tuple[Path, list[dict], dict]], set]] = []
    for run, benchmark, rows, record in runs:
        protocol, config = record.get("protocol", ""), record["config"]
        keys = record.get("pooled_settings") or pooled.get(protocol, [])
        held = {(benchmark.example_id(row), row.get("press"), row.get("budget_label")) for row in rows}
        for name, _, members, examples in groups:
            agree = all(
                config[key] == other[key] for _, _, other in members for key in keys if key in config and key in other
            )
            if name == protocol and agree and not held & examples:
                members.append((run, rows, config))
                examples |= held
                break
        else:
            groups.append((protocol, benchmark, [(run, rows, config)], held))
    names = [name for name, _, _, _ in groups]
    pools = []
    for name, benchmark, members, _ in groups:
        folders = tuple(run for run, _, _ in members)
        title = benchmark.name if names.count(name) == 1 else f"{benchmark.name} ({', '.join(map(str, folders))})"
        pools.append(Pool(title, benchmark, [row for _, rows, _ in members for row in rows], folders))
    return pools


def load_run(run_dir: Path, benchmarks: dict[str, Benchmark]) -> tuple[Benchmark, list[dict], dict]:
    """A run folder's benchmark (``benchmarks``: each protocol's, by the name run.json records), rows and
    run.json record."""
    record_path = run_dir / "run.json"
    if not record_path.is_file():
        raise EvaluationError(f"{record_path} not found: is {run_dir} a run folder?")
    record = read_record(record_path)
    protocol = record.get("protocol", "")
    benchmark = benchmarks.get(protocol)
    if benchmark is None:
        raise EvaluationError(
            f"{record_path}: unknown protocol {protocol!r}; is {run_dir} a run folder of this project?"
        )
    numbered = numbered_rows(run_dir / "predictions.jsonl")
    if not numbered:
        raise EvaluationError(f"{run_dir}: no predictions yet")
    rows = [row for _, row in numbered]
    try:
        scores_frame(benchmark, rows)
    except (KeyError, TypeError) as error:
        raise EvaluationError(
            f"{run_dir}/predictions.jsonl: rows without {error} are not {benchmark.name} rows, which its run.json "
            "names: the folder mixes protocols"
        ) from None
    except ValueError as error:
        raise EvaluationError(f"{run_dir}/predictions.jsonl: {error}") from None
    check_grid(run_dir, benchmark, record, numbered)
    return benchmark, rows, record


def asked_grid(record: dict) -> dict[str, set[str]]:
    """The presses and budgets (their row keys) any session of a run asked for, where its run.json records them
    (a token budget recorded as a number is its ``tokens=N`` key); the full cache's budget is always asked."""
    configs = [record["config"], *(session.get("config") for session in record["sessions"])]
    grid = {}
    for field, setting in (("press", "presses"), ("budget", "budgets")):
        asked = [value for config in configs if isinstance(config, dict) for value in config.get(setting) or []]
        if asked:
            keys = {budget_key(value) for value in asked}
            grid[field] = keys | ({FULL_CACHE} if field == "budget" else set())
    return grid


def budget_key(value: str | int | dict) -> str:
    """A recorded budget's row key: a key as it is, a number of tokens, or a ``Budget`` recorded as a mapping."""
    if isinstance(value, str):
        return value
    return (Budget(**value) if isinstance(value, dict) else Budget("tokens", value)).key


def check_grid(run_dir: Path, benchmark: Benchmark, record: dict, numbered: list[tuple[int, dict]]) -> None:
    """A row the scorecard would pool whose press or budget its run never asked for came from another grid (a file
    edited or copied in): it is refused, never pooled."""
    grid = asked_grid(record)
    for number, row in numbered:
        for field, asked in grid.items():
            if benchmark.conditions(row) and row.get(field) not in asked:
                raise EvaluationError(
                    f"{run_dir / 'predictions.jsonl'}:{number}: {field} {row.get(field)!r} is not in the grid its "
                    f"{run_dir / 'run.json'} asked for ({', '.join(sorted(asked))}): the row comes from another run; "
                    "remove that line, or run that grid into its own folder"
                )


def write_combined(
    output: Path, pools: list[Pool], reference: str, resamples: int, seed: int, partial: list[str] | None = None
) -> pd.DataFrame:
    """The combined scorecard under ``output``: ``scorecard.{md,csv}`` (a score table per pool, with the presses
    that ran in it), the contrasts its benchmarks declare, ``scorecard.png`` and ``forest.png``; ``partial`` names
    runs whose rows are not all in yet."""
    frames = [scores_frame(pool.benchmark, pool.rows, pool.prefix) for pool in pools]
    frame = pd.concat(frames, ignore_index=True)
    if not (frame["press"] == reference).any():
        raise EvaluationError(
            f"--reference {reference!r} is a press of none of the runs: pass one of "
            f"{', '.join(dict.fromkeys(frame['press']))}"
        )
    order = {pool.prefix + condition: i for pool in pools for i, condition in enumerate(pool.benchmark.order)}
    frame["rank"] = frame["condition"].map(order).fillna(len(order))
    frame = frame.sort_values("rank", kind="stable").drop(columns="rank")
    try:
        summary = summarize(frame, reference, resamples, seed)
    except ValueError as error:
        raise EvaluationError(str(error)) from error
    note = (
        f"Mean [95% bootstrap interval over examples, or over the units they share, {resamples} resamples, seed "
        f"{seed}] (n). A table per "
        "benchmark (runs of one benchmark that differ in how scores are computed, or hold the same examples, a "
        "table each, named by their folders), with the presses that ran there. Below, each press against "
        f"{reference} on the examples both ran: the paired difference, its interval and the verdict, per metric "
        "(each benchmark's official score, and the gold answer's likelihood where rows hold it)."
    )
    if partial:
        note += f" Partial: {', '.join(partial)} had not finished (still running, or cut off): its rows so far."
    tables = [
        contrast_table(p.benchmark, p.rows, f"{p.title}: ", resamples, seed) for p in pools if p.benchmark.contrasts
    ]
    contrasts = pd.concat(tables, ignore_index=True) if tables else None
    against = [
        press_contrast_table(part, pool.benchmark.press_contrasts, resamples, seed)
        for pool, part in zip(pools, frames, strict=True)
        if pool.benchmark.press_contrasts
    ]
    press_contrasts = pd.concat(against, ignore_index=True) if against else None
    if press_contrasts is not None:
        with_holm(press_contrasts, [""], seed)  # one family per metric across the pools
    conditions = {pool.title: list(dict.fromkeys(part["condition"])) for pool, part in zip(pools, frames, strict=True)}
    title = f"Scorecard against {reference}"
    write_scorecard(
        output, summary, title, note, reference, contrasts=contrasts, press_contrasts=press_contrasts, tables=conditions
    )
    return summary


def command(args: argparse.Namespace) -> int:
    """``python -m evaluation scorecard``; ``args.benchmarks`` and ``args.pooled``: every protocol's benchmark and
    settings of how its scores are computed, by name."""
    refuse_links(args.output, SCORECARD_FILES)
    refuse_run_folder(args.output)
    pools, partial = load_runs(args.runs, args.benchmarks, args.pooled)
    write_combined(args.output, pools, args.reference, args.resamples, args.seed, partial)
    print(f"scorecard: {args.output / 'scorecard.md'}")
    return 0
