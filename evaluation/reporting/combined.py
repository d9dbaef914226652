"""One scorecard across benchmarks (``python -m evaluation scorecard``): every (condition, budget, press) of
any mix of LongBench, LoCoMo and trace runs with a 95% bootstrap interval over examples, and against a
reference press the paired difference, its verdict (win, tie: the interval contains 0, loss), the verdict after
Holm's correction and the smallest difference each comparison could detect, and the wins / ties / losses per
press (each example counted once), as in the paper's Figure 3, per metric. A press name is its spec, so one name
is one press in every run; a run's benchmark is the protocol its run.json records; runs that hold the same
example twice, and rows of a press or budget their run did not ask for, are refused."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from evaluation.catalogue.budgets import Budget
from evaluation.catalogue.specs import FULL_CACHE
from evaluation.errors import EvaluationError
from evaluation.reporting.conditions import Benchmark
from evaluation.reporting.scorecard import contrast_table, scores_frame, summarize, write_scorecard
from evaluation.runs.files import SCORECARD_FILES, refuse_links
from evaluation.runs.json_rows import numbered_rows
from evaluation.runs.record import read_record


def load_runs(
    run_dirs: list[Path], benchmarks: dict[str, Benchmark]
) -> tuple[list[tuple[Benchmark, list[dict]]], list[str]]:
    """The runs to pool (each folder once, all of one model: name and precision, and runs of one protocol under
    one setting), and those whose last session has not finished (still running, or cut off): their rows so far."""
    seen = [run.resolve() for run in run_dirs]
    twice = sorted({str(run) for run in seen if seen.count(run) > 1})
    if twice:
        raise EvaluationError(f"run {', '.join(twice)} is given twice: its examples would count twice")
    loaded = [load_run(run, benchmarks) for run in run_dirs]
    records = {run: record for run, (_, _, record) in zip(run_dirs, loaded, strict=True)}
    check_same_settings(records)
    models = {run: (str(r["config"].get("model")), str(r["config"].get("dtype"))) for run, r in records.items()}
    if len(set(models.values())) > 1:
        listed = "; ".join(f"{run}: {' '.join(model)}" for run, model in models.items())
        raise EvaluationError(f"the runs are of different models ({listed}): pool the runs of one model")
    partial = [str(run) for run, record in records.items() if not finished(record)]
    return [(benchmark, rows) for benchmark, rows, _ in loaded], partial


def finished(record: dict) -> bool:
    """Whether a run's last session finished (False while it runs, or after it was cut off)."""
    return bool(record["sessions"]) and bool(record["sessions"][-1].get("finished"))


def check_same_settings(records: dict[Path, dict]) -> None:
    """Runs of one protocol are pooled only under the same settings of how scores are computed (what each run.json
    names ``pooled_settings``, from its configuration's field metadata)."""
    first: dict[str, tuple[Path, dict]] = {}
    for run, record in records.items():
        config, protocol = record["config"], record.get("protocol", "")
        if protocol not in first:
            first[protocol] = (run, config)
            continue
        other, seen = first[protocol]
        for key in record.get("pooled_settings", []):
            if key in config and key in seen and config[key] != seen[key]:
                raise EvaluationError(
                    f"{other} and {run} are {protocol} runs with {key} {seen[key]!r} and {config[key]!r}: pool runs "
                    "of one setting (write a scorecard per setting)"
                )


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
            keys = {value if isinstance(value, str) else Budget("tokens", value).key for value in asked}
            grid[field] = keys | ({FULL_CACHE} if field == "budget" else set())
    return grid


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
    output: Path,
    runs: list[tuple[Benchmark, list[dict]]],
    reference: str,
    resamples: int,
    seed: int,
    partial: list[str] | None = None,
) -> pd.DataFrame:
    """The combined scorecard under ``output``: ``scorecard.{md,csv}``, ``scorecard.png`` and ``forest.png``;
    ``partial`` names runs whose rows are not all in yet."""
    frame = pd.concat([scores_frame(b, rows, f"{b.name} ") for b, rows in runs], ignore_index=True)
    twice = frame[frame.duplicated(["metric", "condition", "budget", "press", "example"])]
    if not twice.empty:
        first = twice.iloc[0]
        raise EvaluationError(
            f"the runs overlap: {first['press']} at {first['budget']} on {first['condition']} example "
            f"{first['example']} is in two of them; give each example once"
        )
    if not (frame["press"] == reference).any():
        raise EvaluationError(
            f"--reference {reference!r} is a press of none of the runs: pass one of "
            f"{', '.join(dict.fromkeys(frame['press']))}"
        )
    order = {f"{b.name} {condition}": i for b, _ in runs for i, condition in enumerate(b.order)}
    frame["rank"] = frame["condition"].map(order).fillna(len(order))
    frame = frame.sort_values("rank", kind="stable").drop(columns="rank")
    try:
        summary = summarize(frame, reference, resamples, seed)
    except ValueError as error:
        raise EvaluationError(str(error)) from error
    note = (
        f"Mean [95% bootstrap interval over examples, {resamples} resamples, seed {seed}] (n). Below, each press "
        f"against {reference} on the examples both ran: the paired difference, its interval and the verdict, per "
        "metric (each benchmark's official score, and the gold answer's likelihood where rows hold it)."
    )
    if partial:
        note += f" Partial: {', '.join(partial)} had not finished (still running, or cut off): its rows so far."
    tables = [contrast_table(b, rows, f"{b.name}: ", resamples, seed) for b, rows in runs if b.contrasts]
    contrasts = pd.concat(tables, ignore_index=True) if tables else None
    write_scorecard(output, summary, f"Scorecard against {reference}", note, reference, contrasts=contrasts)
    return summary


def command(args: argparse.Namespace) -> int:
    """``python -m evaluation scorecard``; ``args.benchmarks``: every protocol's, by name."""
    refuse_links(args.output, SCORECARD_FILES)
    runs, partial = load_runs(args.runs, args.benchmarks)
    write_combined(args.output, runs, args.reference, args.resamples, args.seed, partial)
    print(f"scorecard: {args.output / 'scorecard.md'}")
    return 0
