"""Scorecards: every (condition, budget, press) with a bootstrap interval over examples, the paired difference
against a reference press with its verdict, as tables (csv, markdown) and pictures.

A protocol says what its conditions are and what identifies an example (``Benchmark``); one run's scorecard and
the combined scorecard across runs (``evaluation.reporting.combined``) are the same computation. Cells a press could
not run are counted (``failed``) and left out of the means and of the pairs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from evaluation.catalogue.budgets import OVER_THE_CONTEXT
from evaluation.catalogue.specs import FULL_CACHE
from evaluation.reporting import DEFAULT_RESAMPLES, DEFAULT_SEED
from evaluation.reporting.conditions import Benchmark, Contrast
from evaluation.reporting.intervals import (
    MIN_EXAMPLES_FOR_INTERVAL,
    MIN_PAIRS,
    bootstrap,
    paired,
)
from evaluation.runs.files import SCORECARD_FILES, refuse_links, replaced, write_atomically

VERDICT_COLORS = {"win": "#1b9e77", "tie": "#7f7f7f", "loss": "#d95f02"}
MARKERS = "osD^vP*Xhp<>d8"


def scores_frame(benchmark: Benchmark, rows: list[dict], prefix: str = "") -> pd.DataFrame:
    """One line per (condition, budget, press, example): its score (NaN for a failed cell), ``failed``, the output
    the score is of (the prediction; None where a protocol has none) and the score's ceiling. A condition that
    holds exactly the rows of an earlier one (LoCoMo's "evidence visible" when every question's evidence is
    visible) is left out: it would count its comparisons twice."""
    records = [
        {
            "row": index,
            "condition": prefix + condition,
            "budget": row["budget_label"],
            "press": row["press"],
            "example": benchmark.example_id(row),
            "score": np.nan if row.get("error") else row["score"] * benchmark.scale,
            "failed": bool(row.get("error")),
            "output": row.get("prediction"),
        }
        for index, row in enumerate(rows)
        for condition in benchmark.conditions(row)
    ]
    columns = ["row", "condition", "budget", "press", "example", "score", "failed", "output"]
    frame = pd.DataFrame(records, columns=columns)
    if frame.duplicated(["condition", "budget", "press", "example"]).any():
        raise ValueError("an example appears twice for one condition, budget and press: the runs overlap")
    held = {c: frozenset(g["row"]) for c, g in frame.groupby("condition", sort=False)}
    repeated = [c for i, c in enumerate(held) if held[c] in [held[d] for d in list(held)[:i]]]
    frame = frame[~frame["condition"].isin(repeated)].drop(columns="row").reset_index(drop=True)
    frame["digits"], frame["ceiling"] = benchmark.digits, benchmark.scale
    return frame


VERDICTS = ("win", "tie", "loss")  # the comparisons an interval decides; the tallies and forest plots count these


def baselines(reference: str) -> list[tuple[str, str]]:
    """What every press is paired with: (column prefix, press), the reference, then the full cache unless it is the
    reference."""
    return [("", reference)] + ([("full_", FULL_CACHE)] if reference != FULL_CACHE else [])


def baseline_name(against: str) -> str:
    return "the full cache" if against == FULL_CACHE else against


def summarize(
    frame: pd.DataFrame, reference: str, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> pd.DataFrame:
    """Per (condition, budget, press): mean, 95% bootstrap interval, n, failed cells, and the paired difference
    on the examples both ran, its interval and verdict, against ``reference`` at the same condition and budget
    (``diff``, ``diff_low``, ``diff_high``, ``verdict``) and against the full cache (``full_``...). A verdict is
    "identical" when both sides gave the same output in every pair (where a protocol records no output: the same
    score), "no signal" when both scored the floor (or both the ceiling) in every pair, or different outputs the
    same score in every pair, "too few" under ``MIN_PAIRS`` pairs, else win, tie (the interval contains 0)
    or loss; "reference" for the side compared with, "-" with nothing to compare."""
    keys = ["condition", "budget", "press"]
    lines = []
    for (condition, budget, press), group in frame.groupby(keys, sort=False):
        ran = group.dropna(subset=["score"])
        line = {"condition": condition, "budget": budget, "press": press, "n": len(ran)}
        line |= {"failed": int(group["failed"].sum()), "digits": int(group["digits"].iloc[0])}
        if len(ran):
            interval = bootstrap(ran["score"].to_numpy(), resamples, seed)
            line |= {"mean": interval.mean, "low": interval.low, "high": interval.high}
        lines.append(line)
    summary = pd.DataFrame(lines)
    cells = {key: group.set_index("example") for key, group in frame.groupby(keys, sort=False)}
    for prefix, against in baselines(reference):
        summary[f"{prefix}verdict"] = ["reference" if press == against else "-" for press in summary["press"]]
        for index, line in summary.iterrows():
            base_budget = FULL_CACHE if against == FULL_CACHE else line["budget"]
            base = cells.get((line["condition"], base_budget, against))
            if line["press"] in (against, FULL_CACHE) or base is None:
                continue
            cell = cells[line["condition"], line["budget"], line["press"]]
            if against == FULL_CACHE:  # the full cache ran every example; a budget's cell may hold only some
                base = base[base.index.isin(cell.index)]
            label = f"{line['condition']}, {line['budget']}, {line['press']} against {against}"
            verdict, difference = compare(cell, base, label, resamples, seed)
            summary.loc[index, f"{prefix}verdict"] = verdict
            if difference is not None:
                columns = [f"{prefix}diff", f"{prefix}diff_low", f"{prefix}diff_high"]
                summary.loc[index, columns] = difference.mean, difference.low, difference.high
    if reference == FULL_CACHE:  # the pairing with the full cache is the pairing with the reference
        for name in ("diff", "diff_low", "diff_high", "verdict"):
            if name in summary:
                summary[f"full_{name}"] = summary[name]
    for column in (
        "mean",
        "low",
        "high",
        "diff",
        "diff_low",
        "diff_high",
        "full_diff",
        "full_diff_low",
        "full_diff_high",
    ):
        if column not in summary:
            summary[column] = np.nan
    return summary


def compare(cell: pd.DataFrame, base: pd.DataFrame, label: str, resamples: int, seed: int) -> tuple[str, object]:
    """The verdict of ``cell`` against ``base`` (both indexed by example) and the paired interval behind it."""
    pairs = cell.join(base, rsuffix="_base", how="inner").dropna(subset=["score", "score_base"])
    outputs = pairs["output"].notna().all()
    if len(pairs) and outputs and (pairs["output"] == pairs["output_base"]).all():
        return "identical", None
    scores = np.concatenate([pairs["score"].to_numpy(), pairs["score_base"].to_numpy()])
    if len(pairs) and (np.all(scores == 0) or np.all(scores == pairs["ceiling"].iloc[0])):
        return "no signal", None
    if len(pairs) and (pairs["score"] == pairs["score_base"]).all():  # a [0, 0] interval: never a tie
        return ("no signal" if outputs else "identical"), None
    if len(pairs) < MIN_PAIRS:
        return "too few", None
    difference = paired(dict(cell["score"]), dict(base["score"]), label, resamples, seed)
    return difference.verdict(), difference


def contrast_table(
    benchmark: Benchmark,
    rows: list[dict],
    prefix: str = "",
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> pd.DataFrame:
    """Per contrast, budget and press: both conditions' means over the matched pairs, the paired difference with
    its interval and a verdict as ``compare`` gives it (win: the first condition scores higher)."""
    lines = []
    for contrast in benchmark.contrasts:
        frame = _contrast_frame(benchmark, contrast, rows)
        for (budget, press), group in frame.groupby(["budget", "press"], sort=False):
            first, second = (group[group["side"] == side].set_index("pair") for side in (0, 1))
            label = f"{contrast.name}, {budget}, {press}"
            verdict, difference = compare(first, second, label, resamples, seed)
            both = first.join(second, rsuffix="_base", how="inner").dropna(subset=["score", "score_base"])
            line = {"contrast": prefix + contrast.name, "budget": budget, "press": press, "n": len(both)}
            line |= {"minuend": both["score"].mean(), "subtrahend": both["score_base"].mean(), "verdict": verdict}
            if difference is not None:
                line |= {"diff": difference.mean, "diff_low": difference.low, "diff_high": difference.high}
            lines.append(line | {"digits": benchmark.digits})
    columns = ["contrast", "budget", "press", "n", "minuend", "subtrahend", "diff", "diff_low", "diff_high", "verdict"]
    return pd.DataFrame(lines).reindex(columns=[*columns, "digits"])


def _contrast_frame(benchmark: Benchmark, contrast: Contrast, rows: list[dict]) -> pd.DataFrame:
    records = [
        {
            "side": side,
            "budget": row["budget_label"].removesuffix(OVER_THE_CONTEXT),  # the two of a pair may differ in length
            "press": row["press"],
            "pair": contrast.pair(row),
            "score": np.nan if row.get("error") else row["score"] * benchmark.scale,
            "output": row.get("prediction"),
            "ceiling": benchmark.scale,
        }
        for row in rows
        for side, condition in enumerate((contrast.minuend, contrast.subtrahend))
        if condition in benchmark.conditions(row)
    ]
    return pd.DataFrame(records, columns=["side", "budget", "press", "pair", "score", "output", "ceiling"])


def contrast_section(table: pd.DataFrame) -> list[str]:
    """The markdown of the contrasts: one table per contrast."""
    lines = []
    for name, group in table.groupby("contrast", sort=False):
        first, second = name.rpartition(": ")[2].split(" - ", 1)  # the combined scorecard prefixes its benchmark
        lines += ["", f"## {name}, paired", ""]
        lines += [
            f"Each {first} question against the {second} question of its pair (same press, same budget); win: "
            f"{first} scores higher.",
            "",
        ]
        lines += [
            f"| budget | press | {first} | {second} | difference | n | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        for _, line in group.iterrows():
            digits = int(line["digits"])
            difference = (
                "-"
                if pd.isna(line["diff"])
                else interval_text(line["diff"], line["diff_low"], line["diff_high"], digits, True)
            )
            means = [f"{line[side]:.{digits}f}" for side in ("minuend", "subtrahend")]
            cells = [line["budget"], line["press"], *means, difference, line["n"], line["verdict"]]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


def wins_ties_losses(summary: pd.DataFrame, prefix: str = "") -> pd.DataFrame:
    """Per press, how many conditions it wins, ties and loses against the reference (``prefix`` "full_": against
    the full cache); "identical", "no signal" and "too few" are no comparison and are not counted."""
    verdicts = summary[summary[f"{prefix}verdict"].isin(VERDICTS)]
    counts = pd.crosstab(verdicts["press"], verdicts[f"{prefix}verdict"]).reindex(columns=list(VERDICTS), fill_value=0)
    return counts.reindex(list(dict.fromkeys(verdicts["press"])))


def comparisons(summary: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Every real comparison (win, tie or loss) in long form: against the reference, then against the full cache."""
    parts = []
    for prefix, against in baselines(reference):
        chosen = summary[summary[f"{prefix}verdict"].isin(VERDICTS)]
        renamed = {f"{prefix}{name}": name for name in ("diff", "diff_low", "diff_high", "verdict")}
        part = chosen[["condition", "budget", "press", "n", "digits", *renamed]].rename(columns=renamed)
        parts.append(part.assign(against=against))
    return pd.concat(parts, ignore_index=True)


def other_verdicts(summary: pd.DataFrame, prefix: str) -> str:
    """How many pairs of columns got no win / tie / loss, and why."""
    counts = summary[f"{prefix}verdict"].value_counts()
    named = [f"{counts[v]} {v}" for v in ("identical", "no signal", "too few") if v in counts]
    return (
        f"Not compared: {', '.join(named)} (identical: the same output in every pair; no signal: both at the floor, "
        f"both at the ceiling, or the same score in every pair; too few: under {MIN_PAIRS} pairs)."
        if named
        else ""
    )


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
    appendix: list[str] | None = None,
    contrasts: pd.DataFrame | None = None,
) -> None:
    """``scorecard.csv`` (long form), ``scorecard.md`` (conditions x budgets by press, then the differences
    against the reference with wins / ties / losses), ``scorecard.png`` (absolute scores) and ``forest.png``. Every
    press and budget of ``summary`` is in each: ``presses`` and ``budgets`` (a run's asked grid) come first;
    ``contrasts`` (``contrast_table``), when it holds any, go to ``contrasts.csv`` and a section of their own;
    ``appendix`` (markdown lines) closes the markdown. Each file is written new and renamed into place; a link
    where one belongs is refused before any is written (``evaluation.runs.files``)."""
    refuse_links(output, SCORECARD_FILES)
    output.mkdir(parents=True, exist_ok=True)
    columns = ["condition", "budget", "press", "mean", "low", "high", "n", "failed"]
    columns += [
        "diff",
        "diff_low",
        "diff_high",
        "verdict",
        "full_diff",
        "full_diff_low",
        "full_diff_high",
        "full_verdict",
    ]
    with replaced(output / "scorecard.csv") as staging:
        summary[columns].to_csv(staging, index=False)
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
    for prefix, against in baselines(reference):
        lines += comparison_section(summary, prefix, against)
    if contrasts is not None and not contrasts.empty:
        with replaced(output / "contrasts.csv") as staging:
            contrasts.drop(columns="digits").to_csv(staging, index=False)
        lines += contrast_section(contrasts)
    write_atomically(output / "scorecard.md", "\n".join(lines + (appendix or [])) + "\n")
    plot_scores(output / "scorecard.png", summary, presses, budgets)
    plot_forest(output / "forest.png", summary, reference)


def comparison_section(summary: pd.DataFrame, prefix: str, against: str) -> list[str]:
    """The markdown of one set of paired comparisons: the tallies, then one line per real comparison."""
    counts, name = wins_ties_losses(summary, prefix), baseline_name(against)
    lines = ["", f"## Against {name}", ""]
    if prefix == "":
        lines += ["![differences](forest.png)", ""]
    if counts.empty:
        return [*lines, other_verdicts(summary, prefix) or "Nothing to compare."]
    lines += [f"Wins / ties / losses against {name} (a tie is a paired interval that contains 0):", ""]
    lines += [f"- {press}: {row['win']} / {row['tie']} / {row['loss']}" for press, row in counts.iterrows()]
    lines += ["", other_verdicts(summary, prefix)] if other_verdicts(summary, prefix) else []
    lines += [
        "",
        f"| condition | budget | press | difference vs {against} | n | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for _, line in summary[summary[f"{prefix}verdict"].isin(VERDICTS)].iterrows():
        diff = [line[f"{prefix}diff"], line[f"{prefix}diff_low"], line[f"{prefix}diff_high"]]
        difference = interval_text(*diff, line["digits"], signed=True)
        cells = [line["condition"], line["budget"], line["press"], difference, line["n"], line[f"{prefix}verdict"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


def save_figure(figure: Figure, path: Path, dpi: int | None = 110) -> Figure:
    """``figure`` as the picture ``path`` (its format by the suffix), a new file renamed over it (``replaced``);
    ``dpi`` None: the figure's own."""
    with replaced(path) as staging:
        figure.savefig(staging, dpi=dpi)
    return figure


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
    return save_figure(figure, path)


def plot_forest(path: Path, summary: pd.DataFrame, reference: str) -> Figure:
    """The paper's Figure 3 as a forest plot: a row per (condition, budget), a marker per press (its shape in the
    legend) at its paired difference with its interval, coloured by verdict, around a zero line. A panel per
    comparison (against the reference, then against the full cache), and within it per benchmark scale (the
    ``digits`` a benchmark reports). Only real comparisons (win, tie, loss) are drawn."""
    compared = comparisons(summary, reference)
    if compared.empty:  # still a picture, so that no earlier one is left standing
        figure = Figure(figsize=(5, 0.8), layout="constrained")
        figure.text(0.5, 0.5, "no win / tie / loss: every pair identical, without signal, or too few", ha="center")
        return save_figure(figure, path)
    presses = list(dict.fromkeys(compared["press"]))
    groups = list(compared.groupby(["against", "digits"], sort=False))
    heights = [len(group.groupby(["condition", "budget"])) for _, group in groups]
    legend_rows = -(-len(presses) // 4) + 1
    figure = Figure(
        figsize=(8.5, 0.32 * sum(heights) + 0.9 * len(heights) + 0.3 * legend_rows + 0.5), layout="constrained"
    )
    axes = figure.subplots(len(heights), 1, squeeze=False, height_ratios=[h + 1.5 for h in heights])[:, 0]
    spread = 0.7 / max(len(presses), 1)
    for axis, ((against, _), group) in zip(axes, groups, strict=True):
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
                axis.errorbar(
                    line["diff"],
                    y,
                    xerr=errors,
                    marker=MARKERS[i % len(MARKERS)],
                    color=VERDICT_COLORS[line["verdict"]],
                    markersize=4,
                    capsize=2,
                    linewidth=1,
                )
        axis.axvline(0, color="black", linewidth=0.8)
        axis.set_yticks(range(len(rows)), [f"{condition}, {budget}" for condition, budget in rows], fontsize=7)
        axis.set_ylim(len(rows) - 0.5, -0.5)
        axis.tick_params(axis="x", labelsize=7)
        axis.set_xlabel(f"difference against {baseline_name(against)} (95% paired bootstrap interval)", fontsize=7)
        axis.grid(alpha=0.3, axis="x")
    verdicts = [Line2D([], [], marker="s", linestyle="", color=c, label=v) for v, c in VERDICT_COLORS.items()]
    figure.legend(
        handles=legend_handles(presses) + verdicts, loc="outside lower center", ncols=4, fontsize=7, frameon=False
    )
    return save_figure(figure, path)
