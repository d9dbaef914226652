"""The perplexity scorecard: the shared scorecard of each cell's mean NLL (``evaluation.reporting.scorecard``), then
perplexity per press and budget with its interval over texts, its ratio to the full cache paired by text, and a
picture of NLL against position."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from evaluation.catalogue.specs import FULL_CACHE
from evaluation.reporting import DEFAULT_RESAMPLES, DEFAULT_SEED
from evaluation.reporting.conditions import Benchmark
from evaluation.reporting.intervals import bootstrap, paired
from evaluation.reporting.scorecard import MARKERS, save_figure, scores_frame, summarize, write_scorecard
from evaluation.runs.files import refuse_links

POSITION_PICTURE = "nll_by_position.png"
NOTE = (
    "Each cell: the mean NLL per scored token (nats; every token after the first), mean [95% bootstrap interval over "
    "texts] (n), lower is better. Streaming: {form}. The "
    "perplexity section below holds the same cells as exp(NLL)."
)


def perplexity_lines(ran: pd.DataFrame, presses: list[str], budgets: list[str]) -> list[str]:
    """The markdown of perplexity per press and budget, exp of the mean NLL over texts with the exp of its
    bootstrap interval, and the ratio to the full cache, exp of the paired difference of NLL over the texts both
    ran, with its interval."""
    cells = {key: group.set_index("example")["score"] for key, group in ran.groupby(["budget", "press"], sort=False)}
    full = next((scores for (_, press), scores in cells.items() if press == FULL_CACHE), None)
    lines = [
        "",
        "## Perplexity",
        "",
        "exp(mean NLL) [exp of its 95% bootstrap interval over texts] (n); ratio to the full cache: exp of the mean "
        "paired NLL difference over the same texts [its interval].",
        "",
        f"![NLL against position]({POSITION_PICTURE})",
        "",
        "| budget | press | perplexity | ratio to the full cache |",
        "|---|---|---|---|",
    ]
    order = [FULL_CACHE] + [b for b in dict.fromkeys([*budgets, *(b for b, _ in cells)]) if b != FULL_CACHE]
    for budget in order:
        for press in dict.fromkeys([*presses, *(p for _, p in cells)]):
            scores = cells.get((budget, press))
            if scores is None:
                continue
            mean = bootstrap(scores.to_numpy(), DEFAULT_RESAMPLES, DEFAULT_SEED)
            ratio = "-"
            if full is not None and press != FULL_CACHE:
                base = full[full.index.isin(scores.index)]
                label = f"{budget}, {press} against {FULL_CACHE}"
                difference = paired(dict(scores), dict(base), label, DEFAULT_RESAMPLES, DEFAULT_SEED)
                ratio = (
                    f"{math.exp(difference.mean):.3f} [{math.exp(difference.low):.3f}, {math.exp(difference.high):.3f}]"
                )
            text = f"{math.exp(mean.mean):.2f} [{math.exp(mean.low):.2f}, {math.exp(mean.high):.2f}] ({len(scores)})"
            lines.append(f"| {budget} | {press} | {text} | {ratio} |")
    return lines


def plot_positions(path: Path, rows: list[dict], presses: list[str], budgets: list[str], window: int) -> Figure:
    """Mean NLL over texts against position, one panel per budget, one line per press (the full cache in each)."""
    ran = [row for row in rows if not row.get("error")]
    shown = [b for b in dict.fromkeys([*budgets, *(row["budget_label"] for row in ran)]) if b != FULL_CACHE]
    shown = shown or [FULL_CACHE]
    names = list(dict.fromkeys([*presses, *(row["press"] for row in ran)]))
    figure = Figure(figsize=(4.5 * len(shown), 3.6), layout="constrained")
    axes = figure.subplots(1, len(shown), squeeze=False, sharey=True)[0]
    for axis, budget in zip(axes, shown, strict=True):
        for index, press in enumerate(names):
            curves = [
                row["nll_by_position"]
                for row in ran
                if row["press"] == press and (row["budget_label"] == budget or press == FULL_CACHE)
            ]
            if not curves:
                continue
            width = min(map(len, curves))
            mean = np.mean([curve[:width] for curve in curves], axis=0)
            x = (np.arange(width) + 0.5) * window + 1
            axis.plot(x, mean, marker=MARKERS[index % len(MARKERS)], markersize=3, label=press)
        axis.set_title(budget)
        axis.set_xlabel("position (token)")
    axes[0].set_ylabel(f"NLL (nats, mean over texts and {window}-token windows)")
    axes[-1].legend(fontsize="small")
    return save_figure(figure, path)


def write_perplexity_card(
    benchmark: Benchmark,
    output: Path,
    rows: list[dict],
    presses: list[str],
    budgets: list[str],
    form: str,
    window: int,
) -> None:
    """``scorecard.{md,csv}``, ``scorecard.png`` and ``forest.png`` of the NLL cells, the full cache the reference,
    with the perplexity section and ``nll_by_position.png``."""
    refuse_links(output, (POSITION_PICTURE,))
    frame = scores_frame(benchmark, rows)
    summary = summarize(frame, FULL_CACHE)
    appendix = perplexity_lines(frame.dropna(subset=["score"]), presses, budgets)
    title = f"Perplexity: {output.name}"
    write_scorecard(output, summary, title, NOTE.format(form=form), FULL_CACHE, presses, budgets, appendix)
    plot_positions(output / POSITION_PICTURE, rows, presses, budgets, window)
