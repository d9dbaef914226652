"""One scorecard across benchmarks: every (condition, budget, press) with a 95% bootstrap interval over
examples, and against a reference press the paired difference with its interval and a verdict: win, tie
(the interval contains 0) or loss, with a wins / ties / losses summary per press."""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from evaluation.errors import EvaluationError
from evaluation.locomo.runner import CONDITION_ORDER
from evaluation.locomo.runner import conditions as locomo_conditions
from evaluation.longbench.runner import conditions as longbench_conditions
from evaluation.press_specs import FULL_CACHE
from evaluation.statistics import MIN_EXAMPLES_FOR_INTERVAL, Interval, bootstrap, paired
from evaluation.store import read_rows
from evaluation.traces.runner import METRICS as TRACE_METRICS
from evaluation.traces.runner import conditions as traces_conditions

VERDICT_COLORS = {"win": "tab:green", "loss": "tab:purple", "tie": "tab:blue"}


@dataclass(frozen=True)
class Benchmark:
    name: str
    conditions: Callable[[dict], list[str]]
    example_id: Callable[[dict], tuple]
    scale: float  # LongBench reports 100 x mean, LoCoMo the mean F1
    digits: int
    order: tuple[str, ...] = ()  # the protocol's own order of its conditions, if it has one


BENCHMARKS = {
    "longbench": Benchmark("LongBench", longbench_conditions, lambda r: (r["task"], r["id"]), 100, 2),
    "locomo": Benchmark(
        "LoCoMo", locomo_conditions, lambda r: (r["conversation"], r["question_index"]), 1, 3, tuple(CONDITION_ORDER)
    ),
    "traces": Benchmark("Traces", traces_conditions, lambda r: (r["trace"],), 1, 3, TRACE_METRICS),
}


@dataclass(frozen=True)
class Comparison:
    condition: str
    budget: str
    press: str
    score: Interval
    n: int
    difference: Interval | None  # press - reference, paired by example
    verdict: str  # win, tie, loss; "reference"; "n < 2" (no interval); "-" where there is nothing to compare with
    digits: int


def load_run(run_dir: Path) -> tuple[Benchmark, list[dict]]:
    rows = read_rows(run_dir / "predictions.jsonl")
    if not rows:
        raise EvaluationError(f"{run_dir}: no predictions yet")
    kinds = {"task": "longbench", "conversation": "locomo", "trace": "traces"}
    kind = next((kinds[field] for field in kinds if field in rows[0]), None)
    if kind is None:
        raise EvaluationError(f"{run_dir}: neither LongBench, LoCoMo nor trace results")
    return BENCHMARKS[kind], rows


def per_example(runs: list[tuple[Benchmark, list[dict]]]) -> dict[tuple[str, str, str], tuple[Benchmark, dict]]:
    """(condition, budget, press) -> the benchmark and {example id: score}; an example twice is an error."""
    groups: dict[tuple[str, str, str], tuple[Benchmark, dict]] = {}
    for benchmark, rows in runs:
        for row in rows:
            for condition in benchmark.conditions(row):
                key = (f"{benchmark.name} {condition}", row["budget_label"], row["press"])
                scores = groups.setdefault(key, (benchmark, {}))[1]
                example = benchmark.example_id(row)
                if example in scores:
                    raise EvaluationError(f"{key}: example {example} appears in more than one run")
                scores[example] = row["score"]
    return groups


def compare(runs: list[tuple[Benchmark, list[dict]]], reference: str, resamples: int, seed: int) -> list[Comparison]:
    groups = per_example(runs)
    if not any(press == reference for _, _, press in groups):
        raise EvaluationError(f"the reference press {reference!r} is in none of the runs")
    comparisons = []
    for (condition, budget, press), (benchmark, scores) in groups.items():
        score = bootstrap(np.array(list(scores.values())), resamples, seed).scaled(benchmark.scale)
        difference, verdict = None, "-"
        if press == reference:
            verdict = "reference"
        elif len(scores) < MIN_EXAMPLES_FOR_INTERVAL:
            verdict = "n < 2"
        elif press != FULL_CACHE and (condition, budget, reference) in groups:
            reference_scores = groups[(condition, budget, reference)][1]
            try:
                difference = paired(scores, reference_scores, f"{condition} {budget} {press}", resamples, seed)
            except ValueError as error:
                raise EvaluationError(str(error)) from error
            difference = difference.scaled(benchmark.scale)
            verdict = difference.verdict()
        comparisons.append(
            Comparison(condition, budget, press, score, len(scores), difference, verdict, benchmark.digits)
        )
    return sorted(
        comparisons,
        key=lambda c: (condition_rank(groups, c.condition), rank(groups, c.budget, 1), rank(groups, c.press, 2)),
    )


def rank(groups: dict[tuple[str, str, str], object], value: str, part: int) -> int:
    """Order of first appearance of a condition, budget or press among the groups."""
    return list(dict.fromkeys(key[part] for key in groups)).index(value)


def condition_rank(groups: dict[tuple[str, str, str], object], condition: str) -> tuple[int, int]:
    """Benchmark by benchmark; within one, the protocol's own order of conditions, else first appearance."""
    benchmarks = list(BENCHMARKS.values())
    benchmark = next(b for b in benchmarks if condition.startswith(f"{b.name} "))
    name = condition[len(benchmark.name) + 1 :]
    within = benchmark.order.index(name) if name in benchmark.order else rank(groups, condition, 0)
    return benchmarks.index(benchmark), within


def interval_text(interval: Interval | None, digits: int, signed: bool = False) -> str:
    if interval is None:
        return ""
    sign = "+" if signed else ""
    return f"{interval.mean:{sign}.{digits}f} [{interval.low:{sign}.{digits}f}, {interval.high:{sign}.{digits}f}]"


def score_text(comparison: Comparison) -> str:
    if comparison.n < MIN_EXAMPLES_FOR_INTERVAL:
        return f"{comparison.score.mean:.{comparison.digits}f}"
    return interval_text(comparison.score, comparison.digits)


def summary(comparisons: list[Comparison]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for c in comparisons:
        if c.verdict in ("win", "tie", "loss"):
            counts.setdefault(c.press, {"win": 0, "tie": 0, "loss": 0})[c.verdict] += 1
    return counts


def write_comparison(output: Path, comparisons: list[Comparison], reference: str, resamples: int, seed: int) -> None:
    output.mkdir(parents=True, exist_ok=True)
    with (output / "scorecard.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "condition",
                "budget",
                "press",
                "mean",
                "ci_low",
                "ci_high",
                "n",
                "diff",
                "diff_low",
                "diff_high",
                "verdict",
            ]
        )
        for c in comparisons:
            d = c.difference
            writer.writerow(
                [
                    c.condition,
                    c.budget,
                    c.press,
                    c.score.mean,
                    c.score.low,
                    c.score.high,
                    c.n,
                    d.mean if d else "",
                    d.low if d else "",
                    d.high if d else "",
                    c.verdict,
                ]
            )
    lines = [
        f"# Scorecard against {reference}",
        "",
        f"Mean [95% paired bootstrap interval over examples, {resamples} resamples, seed {seed}] (n). The difference "
        f"is press - {reference} on the same examples; a tie is an interval that contains 0.",
        "",
        f"Wins / ties / losses against {reference}:",
        "",
    ]
    lines += [f"- {press}: {c['win']} / {c['tie']} / {c['loss']}" for press, c in summary(comparisons).items()]
    lines += [
        "",
        f"| condition | budget | press | score | n | difference vs {reference} | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        lines.append(
            f"| {c.condition} | {c.budget} | {c.press} | {score_text(c)} | {c.n} | "
            f"{interval_text(c.difference, c.digits, signed=True)} | {c.verdict} |"
        )
    (output / "scorecard.md").write_text("\n".join(lines) + "\n")
    plot_comparison(output / "scorecard.png", comparisons, reference)


def plot_comparison(path: Path, comparisons: list[Comparison], reference: str) -> None:
    """One panel per (condition, budget): a point with its interval per press, the reference in red."""
    panels = list(dict.fromkeys((c.condition, c.budget) for c in comparisons if c.budget != FULL_CACHE))
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure = Figure(figsize=(8, 2.6 * rows))
    axes = figure.subplots(rows, columns, squeeze=False)
    for axis, (condition, budget) in zip(axes.flat, panels, strict=False):
        chosen = [c for c in comparisons if c.condition == condition and c.budget == budget]
        full = next((c for c in comparisons if c.condition == condition and c.press == FULL_CACHE), None)
        if full:
            axis.axvline(full.score.mean, color="black", linestyle="--", linewidth=0.8)
        for y, c in enumerate(chosen):
            color = "tab:red" if c.press == reference else VERDICT_COLORS.get(c.verdict, "tab:gray")
            axis.errorbar(
                c.score.mean,
                y,
                xerr=[[c.score.mean - c.score.low], [c.score.high - c.score.mean]],
                fmt="o",
                color=color,
                capsize=3,
            )
        axis.set_yticks(range(len(chosen)), [c.press for c in chosen], fontsize=7)
        axis.set_title(f"{condition}, {budget}", fontsize=8)
        axis.tick_params(axis="x", labelsize=7)
        axis.grid(alpha=0.3, axis="x")
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    figure.suptitle(
        f"red: {reference}; green: win, purple: loss, blue: tie, gray: no verdict (n < 2); dashed: full cache",
        fontsize=8,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
