"""The kept-set overlap diagnostic: how far each press keeps what the reference press keeps (the paper's section
9: on natural text, demonstrated utility collapses onto accumulated attention).

Each row holds, per layer, the mean over KV heads of its kept set's Jaccard index with the reference press's at the
same budget on the same example (``overlap_with_reference``) and the least KV head's (``overlap_min_head``;
``evaluation.engine.overlap``). The scorecard gets, per press and budget, the mean over layers with a bootstrap
interval over examples, and a picture of the mean per layer (``overlap.png``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from evaluation.catalogue.budgets import OVER_THE_CONTEXT
from evaluation.reporting.intervals import MIN_EXAMPLES_FOR_INTERVAL, bootstrap
from evaluation.reporting.scorecard import interval_text, save_figure
from evaluation.runs.files import refuse_links

PICTURE = "overlap.png"


def overlap_frame(rows: list[dict], reference: str) -> pd.DataFrame:
    """One line per (press, budget, example) whose overlap with the reference is known, the reference's own left
    out: ``layers`` (the mean per layer), ``mean`` (over layers) and ``least`` (the least KV head of any layer)."""
    records = [
        {
            "press": row["press"],
            "budget": row["budget_label"].removesuffix(OVER_THE_CONTEXT),
            "layers": row["overlap_with_reference"],
            "mean": float(np.mean(row["overlap_with_reference"])),
            "least": float(np.min(row["overlap_min_head"])),
        }
        for row in rows
        if row.get("overlap_with_reference") is not None and row["press"] != reference
    ]
    return pd.DataFrame(records, columns=["press", "budget", "layers", "mean", "least"])


def overlap_section(output: Path, rows: list[dict], reference: str) -> list[str]:
    """The scorecard's markdown section on kept-set overlap, and its picture written to ``output``; nothing when
    no row knows its overlap (no reference cell, or every press on its own prefill)."""
    frame = overlap_frame(rows, reference)
    if frame.empty:
        return []
    lines = [
        "",
        f"## Kept-set overlap with {reference}",
        "",
        f"The Jaccard index of each press's kept positions with {reference}'s at the same budget on the same input, "
        "per layer and KV head (1: the same positions); each cell: the mean over layers and KV heads, mean [95% "
        "bootstrap interval over examples] (n), then the mean over examples of the least KV head's. Per layer: "
        f"[{PICTURE}]({PICTURE}).",
        "",
        "| press | budget | Jaccard | least KV head |",
        "|---|---|---|---|",
    ]
    for (press, budget), group in frame.groupby(["press", "budget"], sort=False):
        interval = bootstrap(group["mean"].to_numpy())
        low, high = (interval.low, interval.high) if len(group) >= MIN_EXAMPLES_FOR_INTERVAL else (np.nan, np.nan)
        text = f"{interval_text(interval.mean, low, high, 3)} ({len(group)})"
        lines.append(f"| {press} | {budget} | {text} | {group['least'].mean():.3f} |")
    refuse_links(output, [PICTURE])
    output.mkdir(parents=True, exist_ok=True)
    plot_layers(output / PICTURE, frame, reference)
    return lines


def plot_layers(path: Path, frame: pd.DataFrame, reference: str) -> Figure:
    """The mean Jaccard index per layer over examples, a line per press, a panel per budget."""
    budgets = list(dict.fromkeys(frame["budget"]))
    figure = Figure(figsize=(3.6 * len(budgets) + 0.6, 3.2), layout="constrained")
    axes = figure.subplots(1, len(budgets), squeeze=False)[0]
    presses = list(dict.fromkeys(frame["press"]))
    for axis, budget in zip(axes, budgets, strict=True):
        for i, press in enumerate(presses):
            chosen = frame[(frame["budget"] == budget) & (frame["press"] == press)]
            if len(chosen):
                per_layer = np.mean(np.array(chosen["layers"].tolist(), dtype=np.float64), axis=0)
                axis.plot(range(len(per_layer)), per_layer, color=f"C{i % 10}", marker=".", linewidth=1)
        axis.set_title(f"budget {budget}", fontsize=8)
        axis.set_xlabel("layer", fontsize=7)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_ylim(0, 1.02)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel(f"Jaccard with {reference}", fontsize=7)
    handles = [Line2D([], [], color=f"C{i % 10}", label=press) for i, press in enumerate(presses)]
    figure.legend(handles=handles, loc="outside lower center", ncols=min(4, len(presses)), fontsize=7, frameon=False)
    return save_figure(figure, path)
