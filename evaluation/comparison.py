"""One scorecard across benchmarks (``python -m evaluation scorecard``): every (condition, budget, press) of
any mix of LongBench, LoCoMo and trace runs with a 95% bootstrap interval over examples, and against a
reference press the paired difference, its verdict (win, tie: the interval contains 0, loss) and the wins /
ties / losses per press, as in the paper's Figure 3. A press name is its spec, so one name is one press in every
run; runs that hold the same example twice are refused."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from evaluation.errors import EvaluationError
from evaluation.scorecard import Benchmark, scores_frame, summarize, write_scorecard
from evaluation.store import read_rows


def benchmarks() -> dict[str, Benchmark]:
    from evaluation.locomo.runner import BENCHMARK as LOCOMO
    from evaluation.longbench.runner import BENCHMARK as LONGBENCH
    from evaluation.traces.runner import BENCHMARK as TRACES

    return {"task": LONGBENCH, "conversation": LOCOMO, "trace": TRACES}


def load_run(run_dir: Path) -> tuple[Benchmark, list[dict]]:
    rows = read_rows(run_dir / "predictions.jsonl")
    if not rows:
        raise EvaluationError(f"{run_dir}: no predictions yet")
    if "family" in rows[0]:
        from evaluation.synthetic.task import SYNTHETIC_TASKS

        return SYNTHETIC_TASKS[rows[0]["family"]].benchmark, rows
    benchmark = next((b for field, b in benchmarks().items() if field in rows[0]), None)
    if benchmark is None:
        raise EvaluationError(f"{run_dir}: neither LongBench, LoCoMo, synthetic nor trace results")
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
