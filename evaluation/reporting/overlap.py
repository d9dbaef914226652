"""The kept-set overlap diagnostic: how far each press keeps what the reference press keeps (the paper's section
9: on natural text, demonstrated utility collapses onto accumulated attention).

Each row holds, per layer, the mean over KV heads of its kept set's Jaccard index with the reference press's at the
same budget on the same example (``overlap_with_reference``) and the least KV head's (``overlap_min_head``;
``evaluation.engine.overlap``). The scorecard gets, per press and budget, the mean over layers with a bootstrap
interval over the protocol's declared unit (a bootstrap of clusters where inputs share one: LoCoMo's questions a
conversation), n as inputs and clusters, and a picture of the mean per layer (``overlap.png``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from evaluation.catalogue.budgets import OVER_THE_CONTEXT
from evaluation.reporting.conditions import Benchmark
from evaluation.reporting.intervals import MIN_EXAMPLES_FOR_INTERVAL, cluster_bootstrap
from evaluation.reporting.scorecard import interval_text, pairs_text, save_figure
from evaluation.runs.files import refuse_links

PICTURE = "overlap.png"


def overlap_frame(rows: list[dict], reference: str, benchmark: Benchmark) -> pd.DataFrame:
    """One line per (press, budget, example) whose overlap with the reference is known, the reference's own left
    out: ``layers`` (the mean per layer), ``mean`` (over layers), ``least`` (the least KV head of any layer) and
    ``cluster``, the unit the example shares with others (``Benchmark.cluster_of``; the example itself where the
    protocol declares none)."""
    records = [
        {
            "press": row["press"],
            "budget": row["budget_label"].removesuffix(OVER_THE_CONTEXT),
            "layers": row["overlap_with_reference"],
            "mean": float(np.mean(row["overlap_with_reference"])),
            "least": float(np.min(row["overlap_min_head"])),
            "cluster": str(benchmark.cluster_of(row)),
        }
        for row in rows
        if row.get("overlap_with_reference") is not None and row["press"] != reference
    ]
    return pd.DataFrame(records, columns=["press", "budget", "layers", "mean", "least", "cluster"])


def overlap_section(output: Path, rows: list[dict], reference: str, benchmark: Benchmark) -> list[str]:
    """The scorecard's markdown section on kept-set overlap, and its picture written to ``output``; nothing when
    no row knows its overlap (no reference cell, or every press on its own prefill). Where the benchmark's inputs
    share a unit, each interval is a bootstrap of these clusters and n gives inputs and clusters."""
    frame = overlap_frame(rows, reference, benchmark)
    if frame.empty:
        return []
    unit = benchmark.cluster_unit
    spread = f"the {unit}s the inputs share" if benchmark.cluster else f"{unit}s"
    counted = f"the inputs and their {unit}s" if benchmark.cluster else f"the {unit}s"
    lines = [
        "",
        f"## Kept-set overlap with {reference}",
        "",
        f"The Jaccard index of each press's kept positions with {reference}'s at the same budget on the same input, "
        "per layer and KV head (1: the same positions); each cell: the mean over layers and KV heads, mean [95% "
        f"bootstrap interval over {spread}], n {counted}, then the mean over inputs of the least KV head's. Per "
        f"layer: [{PICTURE}]({PICTURE}).",
        "",
        "| press | budget | Jaccard | n | least KV head |",
        "|---|---|---|---|---|",
    ]
    for (press, budget), group in frame.groupby(["press", "budget"], sort=False):
        clusters = group["cluster"].nunique()
        interval = cluster_bootstrap(group["mean"].to_numpy(), group["cluster"].to_numpy())
        low, high = (interval.low, interval.high) if clusters >= MIN_EXAMPLES_FOR_INTERVAL else (np.nan, np.nan)
        n = pairs_text(pd.Series({"n": len(group), "clusters": clusters, "unit": unit}))
        lines.append(
            f"| {press} | {budget} | {interval_text(interval.mean, low, high, 3)} | {n} | {group['least'].mean():.3f} |"
        )
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
