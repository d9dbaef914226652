"""Scorecards: per-condition tables (csv and markdown) and plots.

A scorecard is a list of ``Entry`` (condition, budget, press, score, n). The protocol decides what a
condition is (a LongBench task, a LoCoMo category) and how a cell's score is computed from its rows.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from evaluation.press_specs import FULL_CACHE
from evaluation.statistics import DEFAULT_RESAMPLES, DEFAULT_SEED, MIN_EXAMPLES_FOR_INTERVAL, bootstrap

AVERAGE = "average"
MARKERS = "osD^vPX*"


@dataclass(frozen=True)
class Entry:
    condition: str
    budget: str  # a budget label, or "full" for the uncompressed cache
    press: str
    score: float
    n: int
    low: float | None = None  # 95% bootstrap interval over examples (None for averages over conditions)
    high: float | None = None


def entries_from_rows(
    rows: list[dict],
    conditions_of: Callable[[dict], list[str]],
    scale: float,
    digits: int,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> list[Entry]:
    """One entry per (condition, budget, press): the mean row score times ``scale``, n, and a seeded
    bootstrap interval over the examples (none for a single example, which has no spread to resample)."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for row in rows:
        for condition in conditions_of(row):
            groups.setdefault((condition, row["budget_label"], row["press"]), []).append(row["score"])
    entries = []
    for (condition, budget, press), scores in groups.items():
        if len(scores) < MIN_EXAMPLES_FOR_INTERVAL:
            entries.append(Entry(condition, budget, press, round(scale * scores[0], digits), 1))
            continue
        interval = bootstrap(np.array(scores), resamples, seed).scaled(scale)
        low, high = round(interval.low, digits), round(interval.high, digits)
        entries.append(Entry(condition, budget, press, round(interval.mean, digits), len(scores), low, high))
    return entries


def with_average(entries: list[Entry], conditions: list[str]) -> list[Entry]:
    """Add, per (budget, press), the mean over conditions, where that press has every condition."""
    if len(conditions) < 2:
        return entries
    averaged = []
    for budget, press in dict.fromkeys((e.budget, e.press) for e in entries):
        cell = [e for e in entries if e.budget == budget and e.press == press]
        if {e.condition for e in cell} == set(conditions):
            mean = round(sum(e.score for e in cell) / len(cell), 2)
            averaged.append(Entry(AVERAGE, budget, press, mean, sum(e.n for e in cell)))
    return entries + averaged


def write_tables(
    output: Path, entries: list[Entry], presses: list[str], budgets: list[str], title: str, metric: str, digits: int = 2
) -> None:
    """``scorecard.csv`` (long form) and ``scorecard.md`` (condition x budget rows, press columns)."""
    conditions = list(dict.fromkeys(e.condition for e in entries))
    output.mkdir(parents=True, exist_ok=True)
    with (output / "scorecard.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["condition", "budget", "press", "score", "ci_low", "ci_high", "n"])
        writer.writerows((e.condition, e.budget, e.press, e.score, e.low, e.high, e.n) for e in entries)
    (output / "scorecard.md").write_text(markdown_table(entries, conditions, presses, budgets, title, metric, digits))


def lookup(entries: Iterable[Entry], condition: str, budget: str, press: str) -> Entry | None:
    budget = FULL_CACHE if press == FULL_CACHE else budget
    return next((e for e in entries if (e.condition, e.budget, e.press) == (condition, budget, press)), None)


def cell_text(entry: Entry | None, digits: int) -> str:
    if entry is None:
        return "-"
    interval = "" if entry.low is None else f" [{entry.low:.{digits}f}, {entry.high:.{digits}f}]"
    return f"{entry.score:.{digits}f}{interval} ({entry.n})"


def markdown_table(
    entries: list[Entry],
    conditions: list[str],
    presses: list[str],
    budgets: list[str],
    title: str,
    metric: str,
    digits: int,
) -> str:
    lines = [
        f"# {title}",
        "",
        f"{metric}; each cell: score [95% bootstrap interval over examples] (n). The full cache is repeated on "
        "every budget row.",
        "",
    ]
    lines.append("| condition | budget | " + " | ".join(presses) + " |")
    lines.append("|---|---|" + "---|" * len(presses))
    for condition in conditions:
        for budget in budgets:
            cells = [lookup(entries, condition, budget, press) for press in presses]
            text = [cell_text(e, digits) for e in cells]
            lines.append(f"| {condition} | {budget} | " + " | ".join(text) + " |")
    return "\n".join(lines) + "\n"


def plot_by_budget(path: Path, entries: list[Entry], presses: list[str], budgets: list[str], metric: str) -> None:
    """Score against budget, one line per press (the full cache dashed), one panel per condition."""
    conditions = list(dict.fromkeys(e.condition for e in entries))
    columns = min(len(conditions), 3)
    rows = -(-len(conditions) // columns)
    figure = Figure(figsize=(max(4.2 * columns, 7.5), 3.4 * rows + 0.8))
    axes = figure.subplots(rows, columns, squeeze=False)
    for axis, condition in zip(axes.flat, conditions, strict=False):
        for index, press in enumerate(presses):
            if press == FULL_CACHE:
                full = lookup(entries, condition, budgets[0], press)
                if full:
                    axis.axhline(full.score, color="black", linestyle="--", linewidth=1, label="full cache")
                continue
            points = [(i, e.score) for i, b in enumerate(budgets) if (e := lookup(entries, condition, b, press))]
            if points:
                axis.plot(*zip(*points, strict=True), marker=MARKERS[index % len(MARKERS)], label=press, alpha=0.85)
        axis.set_title(condition)
        axis.set_xticks(range(len(budgets)), budgets)
        axis.set_ylabel(metric)
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(conditions) :]:
        axis.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), frameon=False)
    figure.tight_layout(rect=(0, 0.8 / figure.get_figheight() + 0.04, 1, 1))
    figure.savefig(path, dpi=110)


def plot_by_turn(path: Path, rows: list[dict], presses: list[str], budgets: list[str], window: int = 10) -> None:
    """F1 against turn index, one line per press, one panel per budget: the mean over conversations of the
    turns in a trailing window of ``window`` turns (single turns are too noisy to read)."""
    figure = Figure(figsize=(6.5, 3.6 * len(budgets)))
    axes = figure.subplots(len(budgets), 1, squeeze=False)[:, 0]
    for axis, budget in zip(axes, budgets, strict=True):
        for press in presses:
            chosen = [r for r in rows if r["press"] == press and r["budget_label"] in (budget, FULL_CACHE)]
            if not chosen:
                continue
            turns = sorted({r["turn"] for r in chosen})
            means = []
            for turn in turns:
                scores = [r["score"] for r in chosen if turn - window < r["turn"] <= turn]
                means.append(sum(scores) / len(scores))
            style = {"color": "black", "linestyle": "--"} if press == FULL_CACHE else {}
            axis.plot(turns, means, label="full cache" if press == FULL_CACHE else press, **style)
        axis.set_title(f"budget {budget}")
        axis.set_xlabel("turn index")
        axis.set_ylabel(f"F1 (mean of {window} turns)")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
