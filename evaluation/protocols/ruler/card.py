"""The scorecards of RULER and needle-in-a-haystack: the shared tables and verdicts, RULER's category averages and
the leaderboard's picture (score against compression ratio, a line per press, the full cache a reference line),
and the needle's heatmaps of score over depth and length."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from evaluation.catalogue.specs import FULL_CACHE
from evaluation.protocols.protocol import REFERENCE
from evaluation.protocols.ruler.protocol import AVERAGE, CATEGORY, NeedleConfig, RulerConfig
from evaluation.protocols.single_turn.config import SingleTurnConfig
from evaluation.reporting.conditions import ANSWER_NLL, Benchmark
from evaluation.reporting.overlap import overlap_section
from evaluation.reporting.scorecard import MARKERS, save_figure, scores_frame, summarize
from evaluation.reporting.scorecard import write_scorecard as write_card

LEADERBOARD = "leaderboard.png"
HEATMAPS = "heatmaps.png"


def summary_of(benchmark: Benchmark, config: SingleTurnConfig, rows: list[dict]) -> pd.DataFrame:
    measured = (ANSWER_NLL,) if config.likelihood_only else ()
    return summarize(scores_frame(replace(benchmark, measured=measured), rows), REFERENCE)


def scored(config: SingleTurnConfig, rule: str) -> str:
    if config.likelihood_only:
        return "Likelihood only: the gold answer's mean NLL per token under each cache (lower is better)"
    return rule


def ratios_of(rows: list[dict]) -> dict[tuple[int, str], float]:
    """Each (length, budget)'s mean compression ratio over the rows that ran (a token budget's varies with the
    context's length)."""
    frame = pd.DataFrame([row for row in rows if not row.get("error") and row["press"] != FULL_CACHE])
    if frame.empty:
        return {}
    return frame.groupby(["length", "budget_label"])["compression_ratio"].mean().to_dict()


def plot_leaderboard(
    path: Path, summary: pd.DataFrame, ratios: dict[tuple[int, str], float], lengths: list[int]
) -> Figure:
    """KVPress's leaderboard picture per length: the average score over tasks against the compression ratio, a line
    per press with its interval, the full cache a dashed line."""
    metric = summary["metric"].iloc[0]
    chosen = summary[summary["metric"] == metric]
    figure = Figure(figsize=(4 * len(lengths) + 0.5, 3.4), layout="constrained")
    axes = figure.subplots(1, len(lengths), squeeze=False)[0]
    presses = [press for press in dict.fromkeys(chosen["press"]) if press != FULL_CACHE]
    for axis, length in zip(axes, lengths, strict=True):
        condition = chosen[chosen["condition"] == f"{AVERAGE} @ {length}"]
        full = condition[condition["press"] == FULL_CACHE]
        if len(full):
            axis.axhline(full["mean"].iloc[0], color="black", linestyle="--", linewidth=1, label="full cache")
        for i, press in enumerate(presses):
            line = condition[condition["press"] == press]
            line = line.assign(ratio=[ratios.get((length, budget)) for budget in line["budget"]])
            line = line.dropna(subset=["ratio", "mean"]).sort_values("ratio")
            errors = [(line["mean"] - line["low"]).to_numpy(), (line["high"] - line["mean"]).to_numpy()]
            axis.errorbar(
                line["ratio"], line["mean"], yerr=errors, marker=MARKERS[i % len(MARKERS)], capsize=2, label=press
            )
        axis.set_title(f"{length} tokens", fontsize=9)
        axis.set_xlabel("compression ratio (fraction evicted)", fontsize=8)
        axis.set_ylabel(f"{metric.name} ({metric.unit}; {metric.direction})", fontsize=8)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return save_figure(figure, path)


def ordered(summary: pd.DataFrame, names: list[str], lengths: list[int]) -> list[str]:
    held = set(summary["condition"])
    return [f"{name} @ {length}" for name in names for length in lengths if f"{name} @ {length}" in held]


def write_ruler_scorecard(benchmark: Benchmark, config: RulerConfig, rows: list[dict]) -> None:
    summary = summary_of(benchmark, config, rows)
    lengths = sorted({row["length"] for row in rows if "length" in row})
    categories = list(dict.fromkeys(CATEGORY[task] for task in config.tasks))
    tables = {
        "Average over tasks": ordered(summary, [AVERAGE], lengths),
        "RULER's categories (mean of their tasks)": ordered(summary, categories, lengths),
        "Tasks": ordered(summary, config.tasks, lengths),
    }
    rule = (
        "RULER's score: 100 x string_match_all (the share of gold answers the prediction holds, lower-cased) per "
        "example, string_match_part (any one) for qa"
    )
    mode = "query-aware (the question compressed with the context)" if config.query_aware else "query-agnostic"
    note = (
        f"{scored(config, rule)}; {mode}. Each cell: mean [95% bootstrap interval over examples] (n). A category "
        "and the average pool their tasks' examples (equal n per task: the mean of the task means)."
    )
    output = config.output
    plot_leaderboard(output / LEADERBOARD, summary, ratios_of(rows), lengths)
    appendix = ["", "## Score against compression ratio", "", f"![leaderboard]({LEADERBOARD})"]
    appendix += overlap_section(output, rows, REFERENCE, benchmark)
    presses, labels = config.presses, [budget.label for budget in config.budgets]
    write_card(output, summary, f"RULER: {output.name}", note, REFERENCE, presses, labels, appendix, tables=tables)


def heatmap_grid(rows: list[dict], press: str, budget: str, lengths: list[int], depths: list[float]) -> np.ndarray:
    """The mean score of ``press`` at ``budget`` per (length, depth): NaN where nothing ran."""
    grid = np.full((len(lengths), len(depths)), np.nan)
    for i, length in enumerate(lengths):
        for j, depth in enumerate(depths):
            scores = [
                row["score"]
                for row in rows
                if row["press"] == press
                and row["budget_label"] == budget
                and row.get("length") == length
                and row.get("depth") == depth
                and row.get("score") is not None
            ]
            grid[i, j] = np.mean(scores) if scores else np.nan
    return grid


def plot_heatmaps(path: Path, rows: list[dict], scale: float) -> Figure:
    """A heatmap of score over depth (columns) and length (rows) per press and budget, the full cache first."""
    ran = [row for row in rows if not row.get("error")]
    lengths = sorted({row["length"] for row in ran})
    depths = sorted({row["depth"] for row in ran})
    panels = list(dict.fromkeys((row["press"], row["budget_label"]) for row in ran))
    panels.sort(key=lambda panel: panel[0] != FULL_CACHE)
    columns = min(4, len(panels))
    figure = Figure(figsize=(3.2 * columns, 2.4 * -(-len(panels) // columns) + 0.4), layout="constrained")
    axes = figure.subplots(-(-len(panels) // columns), columns, squeeze=False)
    for axis, (press, budget) in zip(axes.flat, panels, strict=False):
        grid = heatmap_grid(ran, press, budget, lengths, depths) * scale
        image = axis.imshow(grid, vmin=0, vmax=scale, cmap="RdYlGn", aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            if not np.isnan(value):
                axis.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=6)
        axis.set_title(press if press == FULL_CACHE else f"{press} @ {budget}", fontsize=8)
        axis.set_xticks(range(len(depths)), [f"{100 * d:.0f}" for d in depths], fontsize=6)
        axis.set_yticks(range(len(lengths)), [str(length) for length in lengths], fontsize=6)
        axis.set_xlabel("needle depth (% of the context)", fontsize=7)
        axis.set_ylabel("length (tokens)", fontsize=7)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    figure.colorbar(image, ax=axes, shrink=0.6, label="score")
    return save_figure(figure, path)


def write_needle_scorecard(benchmark: Benchmark, config: NeedleConfig, rows: list[dict]) -> None:
    summary = summary_of(benchmark, config, rows)
    rule = "KVPress's needle-in-a-haystack score, 100 x per example"
    note = f"{scored(config, rule)}. Each cell: mean [95% bootstrap interval over the depths and lengths] (n)."
    output = config.output
    appendix = []
    if not config.likelihood_only:
        plot_heatmaps(output / HEATMAPS, rows, benchmark.scale)
        appendix = ["", "## Score over depth and length", "", f"![heatmaps]({HEATMAPS})"]
    appendix += overlap_section(output, rows, REFERENCE, benchmark)
    presses, labels = config.presses, [budget.label for budget in config.budgets]
    write_card(output, summary, f"Needle in a haystack: {output.name}", note, REFERENCE, presses, labels, appendix)
