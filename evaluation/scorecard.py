"""Scorecards: every (condition, budget, press) with a bootstrap interval over examples, the paired difference
against a reference press with its verdict, as tables (csv, markdown) and pictures.

A protocol says what its conditions are and what identifies an example (``Benchmark``); one run's scorecard and
the combined scorecard across runs (``evaluation.comparison``) are the same computation. Cells a press could
not run are counted (``failed``) and left out of the means and of the pairs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from evaluation.benchmark import Benchmark
from evaluation.press_specs import FULL_CACHE
from evaluation.statistics import MIN_EXAMPLES_FOR_INTERVAL, bootstrap, paired

RESAMPLES, SEED = 10_000, 0
VERDICT_COLORS = {"win": "#1b9e77", "tie": "#7f7f7f", "loss": "#d95f02"}
MARKERS = "osD^vP*Xhp<>d8"


def scores_frame(benchmark: Benchmark, rows: list[dict], prefix: str = "") -> pd.DataFrame:
    """One line per (condition, budget, press, example): its score (NaN for a failed cell) and ``failed``."""
    records = [
        {
            "condition": prefix + condition,
            "budget": row["budget_label"],
            "press": row["press"],
            "example": benchmark.example_id(row),
            "score": np.nan if row.get("error") else row["score"] * benchmark.scale,
            "failed": bool(row.get("error")),
        }
        for row in rows
        for condition in benchmark.conditions(row)
    ]
    frame = pd.DataFrame(records, columns=["condition", "budget", "press", "example", "score", "failed"])
    if frame.duplicated(["condition", "budget", "press", "example"]).any():
        raise ValueError("an example appears twice for one condition, budget and press: the runs overlap")
    frame["digits"] = benchmark.digits
    return frame


def summarize(frame: pd.DataFrame, reference: str, resamples: int = RESAMPLES, seed: int = SEED) -> pd.DataFrame:
    """Per (condition, budget, press): mean, 95% bootstrap interval, n, failed cells, and against ``reference``
    at the same condition and budget the paired difference on the examples both ran, its interval and verdict
    (win, tie when the interval contains 0, loss; "reference"; "n < 2"; "-" with nothing to compare)."""
    keys = ["condition", "budget", "press"]
    lines = []
    for (condition, budget, press), group in frame.groupby(keys, sort=False):
        ran = group.dropna(subset=["score"])
        line = {"condition": condition, "budget": budget, "press": press, "n": len(ran)}
        line |= {"failed": int(group["failed"].sum()), "digits": int(group["digits"].iloc[0])}
        if len(ran):
            interval = bootstrap(ran["score"].to_numpy(), resamples, seed)
            line |= {"mean": interval.mean, "low": interval.low, "high": interval.high}
        line["verdict"] = "reference" if press == reference else "-"
        lines.append(line)
    summary = pd.DataFrame(lines)
    by_cell = {
        key: dict(zip(group["example"], group["score"], strict=True)) for key, group in frame.groupby(keys, sort=False)
    }
    for index, line in summary.iterrows():
        reference_scores = by_cell.get((line["condition"], line["budget"], reference))
        if line["press"] in (reference, FULL_CACHE) or reference_scores is None:
            continue
        scores = by_cell[line["condition"], line["budget"], line["press"]]
        label = f"{line['condition']}, {line['budget']}, {line['press']}"
        valid = sum(not (np.isnan(scores[e]) or np.isnan(reference_scores.get(e, np.nan))) for e in scores)
        if valid < MIN_EXAMPLES_FOR_INTERVAL:
            summary.loc[index, "verdict"] = "n < 2"
            continue
        difference = paired(scores, reference_scores, label, resamples, seed)
        summary.loc[index, ["diff", "diff_low", "diff_high"]] = difference.mean, difference.low, difference.high
        summary.loc[index, "verdict"] = difference.verdict()
    for column in ("mean", "low", "high", "diff", "diff_low", "diff_high"):
        if column not in summary:
            summary[column] = np.nan
    return summary


def wins_ties_losses(summary: pd.DataFrame) -> pd.DataFrame:
    """Per press, how many conditions it wins, ties and loses against the reference."""
    verdicts = summary[summary["verdict"].isin(["win", "tie", "loss"])]
    counts = pd.crosstab(verdicts["press"], verdicts["verdict"]).reindex(columns=["win", "tie", "loss"], fill_value=0)
    return counts.reindex(list(dict.fromkeys(verdicts["press"])))


def interval_text(mean: float, low: float, high: float, digits: int, signed: bool = False) -> str:
    if pd.isna(mean):
        return ""
    sign = "+" if signed else ""
    if pd.isna(low):
        return f"{mean:{sign}.{digits}f}"
    return f"{mean:{sign}.{digits}f} [{low:{sign}.{digits}f}, {high:{sign}.{digits}f}]"


def cell_text(line: pd.Series) -> str:
    if line["n"] == 0:
        return f"failed ({line['failed']})"
    low, high = (line["low"], line["high"]) if line["n"] >= MIN_EXAMPLES_FOR_INTERVAL else (np.nan, np.nan)
    failed = f", {line['failed']} failed" if line["failed"] else ""
    return f"{interval_text(line['mean'], low, high, line['digits'])} ({line['n']}{failed})"


def write_scorecard(
    output: Path,
    summary: pd.DataFrame,
    title: str,
    note: str,
    reference: str,
    presses: list[str] | None = None,
    budgets: list[str] | None = None,
) -> None:
    """``scorecard.csv`` (long form), ``scorecard.md`` (conditions x budgets by press, then the differences
    against the reference with wins / ties / losses), ``scorecard.png`` (absolute scores) and ``forest.png``. Every
    press and budget of ``summary`` is in each: ``presses`` and ``budgets`` (a run's asked grid) come first."""
    output.mkdir(parents=True, exist_ok=True)
    columns = ["condition", "budget", "press", "mean", "low", "high", "n", "failed"]
    columns += ["diff", "diff_low", "diff_high", "verdict"]
    summary[columns].to_csv(output / "scorecard.csv", index=False)
    presses = list(dict.fromkeys([*(presses or []), *summary["press"]]))  # the asked ones first, then any stored
    budgets = [b for b in dict.fromkeys([*(budgets or []), *summary["budget"]]) if b != FULL_CACHE]
    table = summary.assign(text=summary.apply(cell_text, axis=1))
    full = table[table["press"] == FULL_CACHE].set_index("condition")["text"]
    rows = []
    for condition in dict.fromkeys(table["condition"]):
        compressed = table[(table["condition"] == condition) & (table["press"] != FULL_CACHE)]
        for budget in [b for b in budgets if b in set(compressed["budget"])] or budgets:
            cells = table[(table["condition"] == condition) & (table["budget"] == budget)].set_index("press")["text"]
            texts = [full.get(condition, "-") if press == FULL_CACHE else cells.get(press, "-") for press in presses]
            rows.append(f"| {condition} | {budget} | " + " | ".join(texts) + " |")
    lines = [f"# {title}", "", note, "", "![scores](scorecard.png)", ""]
    lines += ["| condition | budget | " + " | ".join(presses) + " |", "|---|---|" + "---|" * len(presses), *rows]
    counts = wins_ties_losses(summary)
    if not counts.empty:
        lines += ["", f"## Against {reference}", "", "![differences](forest.png)", ""]
        lines += [f"Wins / ties / losses against {reference} (a tie is a paired interval that contains 0):", ""]
        lines += [f"- {press}: {row['win']} / {row['tie']} / {row['loss']}" for press, row in counts.iterrows()]
        compared = summary[summary["verdict"].isin(["win", "tie", "loss"])]
        lines += [
            "",
            f"| condition | budget | press | difference vs {reference} | n | verdict |",
            "|---|---|---|---|---|---|",
        ]
        for _, line in compared.iterrows():
            difference = interval_text(line["diff"], line["diff_low"], line["diff_high"], line["digits"], signed=True)
            cells = [line["condition"], line["budget"], line["press"], difference, line["n"], line["verdict"]]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    (output / "scorecard.md").write_text("\n".join(lines) + "\n")
    plot_scores(output / "scorecard.png", summary, presses, budgets)
    plot_forest(output / "forest.png", summary, reference)


def legend_handles(presses: list[str]) -> list[Line2D]:
    return [
        Line2D([], [], marker=MARKERS[i % len(MARKERS)], linestyle="", color="black", label=press)
        for i, press in enumerate(presses)
    ]


def plot_scores(path: Path, summary: pd.DataFrame, presses: list[str], budgets: list[str]) -> Figure:
    """Absolute scores against budget, one panel per condition: a line per press with its interval, the full
    cache a dashed reference line; the legend sits below the panels."""
    conditions = list(dict.fromkeys(summary["condition"]))
    compressed = [press for press in presses if press != FULL_CACHE]
    columns = min(3, len(conditions))
    rows = -(-len(conditions) // columns)
    legend_rows = -(-len(presses) // 4)
    figure = Figure(figsize=(3.6 * columns + 0.6, 2.7 * rows + 0.35 * legend_rows + 0.4), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False)
    colors = {press: f"C{i % 10}" for i, press in enumerate(compressed)}
    for axis, condition in zip(axes.flat, conditions, strict=False):
        chosen = summary[summary["condition"] == condition]
        full = chosen[chosen["press"] == FULL_CACHE]
        if len(full) and not pd.isna(full["mean"].iloc[0]):
            axis.axhline(full["mean"].iloc[0], color="black", linestyle="--", linewidth=1)
        for i, press in enumerate(compressed):
            line = chosen[chosen["press"] == press].set_index("budget").reindex(budgets)
            x = np.arange(len(budgets)) + (i - (len(compressed) - 1) / 2) * 0.04
            errors = [(line["mean"] - line["low"]).to_numpy(), (line["high"] - line["mean"]).to_numpy()]
            axis.errorbar(
                x,
                line["mean"].to_numpy(),
                yerr=errors,
                marker=MARKERS[i % len(MARKERS)],
                color=colors[press],
                capsize=2,
                markersize=4,
                linewidth=1,
            )
        axis.set_title(condition, fontsize=8)
        axis.set_xticks(range(len(budgets)), budgets, fontsize=7)
        axis.tick_params(axis="y", labelsize=7)
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(conditions) :]:
        axis.set_visible(False)
    handles = [Line2D([], [], color="black", linestyle="--", label="full cache")] if FULL_CACHE in presses else []
    handles += [
        Line2D([], [], marker=MARKERS[i % len(MARKERS)], color=colors[press], label=press)
        for i, press in enumerate(compressed)
    ]
    figure.legend(handles=handles, loc="outside lower center", ncols=min(4, len(handles)), fontsize=7, frameon=False)
    figure.savefig(path, dpi=110)
    return figure


def plot_forest(path: Path, summary: pd.DataFrame, reference: str) -> Figure | None:
    """The paper's Figure 3 as a forest plot: a row per (condition, budget), a marker per press (its shape in the
    legend) at its paired difference against the reference with its interval, coloured by verdict, around a zero
    line. Benchmarks with their own scale (a condition prefix before the first space of ``LongBench ...``) get
    panels of their own."""
    compared = summary[summary["verdict"].isin(["win", "tie", "loss"])]
    if compared.empty:
        return None
    presses = list(dict.fromkeys(compared["press"]))
    groups = compared.groupby(compared["digits"], sort=False)
    heights = [len(group.groupby(["condition", "budget"])) for _, group in groups]
    legend_rows = -(-len(presses) // 4) + 1
    figure = Figure(
        figsize=(8.5, 0.32 * sum(heights) + 0.9 * len(heights) + 0.3 * legend_rows + 0.5), layout="constrained"
    )
    axes = figure.subplots(len(heights), 1, squeeze=False, height_ratios=[h + 1.5 for h in heights])[:, 0]
    spread = 0.7 / max(len(presses), 1)
    for axis, (_, group) in zip(axes, groups, strict=True):
        rows = list(dict.fromkeys(zip(group["condition"], group["budget"], strict=True)))
        for position, (condition, budget) in enumerate(rows):
            for i, press in enumerate(presses):
                line = group[
                    (group["condition"] == condition) & (group["budget"] == budget) & (group["press"] == press)
                ]
                if line.empty:
                    continue
                line = line.iloc[0]
                y = position + (i - (len(presses) - 1) / 2) * spread
                errors = [[line["diff"] - line["diff_low"]], [line["diff_high"] - line["diff"]]]
                color = VERDICT_COLORS[line["verdict"]]
                axis.errorbar(
                    line["diff"],
                    y,
                    xerr=errors,
                    marker=MARKERS[i % len(MARKERS)],
                    color=color,
                    markersize=4,
                    capsize=2,
                    linewidth=1,
                )
        axis.axvline(0, color="black", linewidth=0.8)
        axis.set_yticks(range(len(rows)), [f"{condition}, {budget}" for condition, budget in rows], fontsize=7)
        axis.set_ylim(len(rows) - 0.5, -0.5)
        axis.tick_params(axis="x", labelsize=7)
        axis.set_xlabel(f"difference against {reference} (95% paired bootstrap interval)", fontsize=7)
        axis.grid(alpha=0.3, axis="x")
    verdicts = [Line2D([], [], marker="s", linestyle="", color=c, label=v) for v, c in VERDICT_COLORS.items()]
    figure.legend(
        handles=legend_handles(presses) + verdicts, loc="outside lower center", ncols=4, fontsize=7, frameon=False
    )
    figure.savefig(path, dpi=110)
    return figure
