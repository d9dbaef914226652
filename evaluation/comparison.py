"""One scorecard across benchmarks (``python -m evaluation scorecard``): every (condition, budget, press) of
any mix of LongBench, LoCoMo and trace runs with a 95% bootstrap interval over examples, and against a
reference press the paired difference, its verdict (win, tie: the interval contains 0, loss) and the wins /
ties / losses per press, as in the paper's Figure 3. A press name is its spec, so one name is one press in every
run; a run's benchmark is the protocol its run.json records; runs that hold the same example twice are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from evaluation.benchmark import Benchmark
from evaluation.errors import EvaluationError
from evaluation.scorecard import scores_frame, summarize, write_scorecard
from evaluation.store import read_rows


def benchmark_of(protocol: str) -> Benchmark | None:
    """The benchmark of a protocol or streamed task, by the name its run.json records."""
    from evaluation.longbench.runner import BENCHMARK as LONGBENCH
    from evaluation.longbench.runner import PROTOCOL as LONGBENCH_PROTOCOL
    from evaluation.streaming.task import tasks
    from evaluation.traces.runner import BENCHMARK as TRACES
    from evaluation.traces.runner import PROTOCOL as TRACES_PROTOCOL

    streamed = {name: task.benchmark for name, task in tasks().items()}
    return {LONGBENCH_PROTOCOL: LONGBENCH, TRACES_PROTOCOL: TRACES, **streamed}.get(protocol)


def load_run(run_dir: Path) -> tuple[Benchmark, list[dict]]:
    record_path = run_dir / "run.json"
    try:
        protocol = json.loads(record_path.read_text()).get("protocol", "")
    except (OSError, ValueError) as error:
        raise EvaluationError(f"{record_path}: no readable run.json ({error}); is {run_dir} a run folder?") from error
    benchmark = benchmark_of(protocol)
    if benchmark is None:
        raise EvaluationError(
            f"{record_path}: unknown protocol {protocol!r}; is {run_dir} a run folder of this project?"
        )
    rows = read_rows(run_dir / "predictions.jsonl")
    if not rows:
        raise EvaluationError(f"{run_dir}: no predictions yet")
    return benchmark, rows


def write_combined(
    output: Path, runs: list[tuple[Benchmark, list[dict]]], reference: str, resamples: int, seed: int
) -> pd.DataFrame:
    """The combined scorecard under ``output``: ``scorecard.{md,csv}``, ``scorecard.png`` and ``forest.png``."""
    try:
        frame = pd.concat([scores_frame(b, rows, f"{b.name} ") for b, rows in runs], ignore_index=True)
    except ValueError as error:
        raise EvaluationError(f"the runs overlap: {error}") from error
    if not (frame["press"] == reference).any():
        raise EvaluationError(f"the reference press {reference!r} is in none of the runs")
    order = {f"{b.name} {condition}": i for b, _ in runs for i, condition in enumerate(b.order)}
    frame["rank"] = frame["condition"].map(order).fillna(len(order))
    frame = frame.sort_values("rank", kind="stable").drop(columns="rank")
    try:
        summary = summarize(frame, reference, resamples, seed)
    except ValueError as error:
        raise EvaluationError(str(error)) from error
    note = (
        f"Mean [95% bootstrap interval over examples, {resamples} resamples, seed {seed}] (n). Below, each press "
        f"against {reference} on the examples both ran: the paired difference, its interval and the verdict."
    )
    write_scorecard(output, summary, f"Scorecard against {reference}", note, reference)
    return summary
