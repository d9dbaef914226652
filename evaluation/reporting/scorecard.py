"""Scorecards: every (metric, condition, budget, press) with a bootstrap interval over examples, the paired
difference against a reference press with its verdict, its p-value, the smallest difference its n could detect and
a verdict after Holm's correction, as tables (csv, markdown) and pictures.

A protocol says what its conditions are, what identifies an example and which metrics its rows hold
(``Benchmark``, ``Metric``); one run's scorecard and the combined scorecard across runs
(``evaluation.reporting.combined``) are the same computation. Cells a press could not run are counted (``failed``)
and left out of the means and of the pairs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from evaluation.catalogue.budgets import OVER_THE_CONTEXT
from evaluation.catalogue.specs import FULL_CACHE, plan_spec
from evaluation.reporting import DEFAULT_RESAMPLES, DEFAULT_SEED
from evaluation.reporting.conditions import Benchmark, Contrast, Metric, PressContrast
from evaluation.reporting.intervals import (
    EXACT_TO_SETTLE,
    EXACT_UP_TO,
    MAX_FLIPS,
    MC_ERROR_SE,
    MIN_EXAMPLES_FOR_INTERVAL,
    MIN_FLIPS,
    MIN_PAIRS,
    Difference,
    cluster_bootstrap,
    holm,
    holm_verdict,
    paired,
    settled,
)
from evaluation.runs.files import SCORECARD_FILES, refuse_links, replaced, write_atomically

TOO_FEW = "too few"
NO_HEADROOM = "tie (no headroom)"  # a tie against a reference that itself ties the full cache there
VERDICT_COLORS = {"win": "#1b9e77", "tie": "#7f7f7f", "loss": "#d95f02", TOO_FEW: "#bdbdbd", NO_HEADROOM: "#bdbdbd"}
MARKERS = "osD^vP*Xhp<>d8"
COMPARED = ("diff", "diff_low", "diff_high", "verdict", "p", "p_error", "mde", "holm_p", "holm_verdict")
POWER_NOTE = (
    "p: the paired sign-flip permutation test of the mean difference (two-sided; on the summed differences of each "
    f"cluster where pairs share a unit), exact over every sign assignment up to {EXACT_UP_TO} non-zero differences, "
    f"else {MIN_FLIPS:,} seeded random flips with the Monte Carlo error (`p_error` in the csv, {MC_ERROR_SE:g} "
    "standard errors); where that error leaves a decision after Holm open, every sign assignment up to "
    f"{EXACT_TO_SETTLE} non-zero differences, else up to {MAX_FLIPS:,} flips. A verdict is win or loss where p < "
    "0.05 in the metric's direction, else tie; the interval (a bootstrap, of clusters where pairs share a unit) "
    "only shows the spread. MDE: the smallest difference these pairs detect with 80% power at a two-sided 5% level, "
    "(z_0.975 + z_0.8) x the mean's standard error (cluster-robust where pairs share a unit; SD / sqrt(n) "
    "otherwise; normal approximation). Holm: the verdict after Holm's correction over the primary family (below)."
)


def scores_frame(benchmark: Benchmark, rows: list[dict], prefix: str = "") -> pd.DataFrame:
    """One line per (metric, condition, budget, press, example) for each of the benchmark's metrics a row holds:
    its value (NaN for a failed cell), ``failed``, the output that makes two presses identical (None where the
    metric or the protocol has none), the metric's digits and ceiling (NaN for an unbounded metric). A condition
    that holds exactly the rows of an earlier one (LoCoMo's "evidence visible" when every question's evidence is
    visible) is left out: it would count its comparisons twice."""
    records = [
        {
            "row": index,
            "metric": metric,
            "benchmark": benchmark.name,
            "condition": prefix + condition,
            "budget": row["budget_label"],
            "press": row["press"],
            "example": benchmark.example_id(row),
            "cluster": benchmark.cluster_of(row),
            "unit": benchmark.cluster_unit,
            "score": np.nan if row.get("error") else row[metric.field] * metric.scale,
            "failed": bool(row.get("error")),
            "output": row.get(metric.output) if metric.output else None,
            "digits": metric.digits,
            "ceiling": metric.scale if metric.bounded else np.nan,
        }
        for metric in benchmark.metrics
        for index, row in enumerate(rows)
        if row.get("error") or row.get(metric.field) is not None
        for condition in benchmark.conditions(row)
    ]
    columns = ["row", "metric", "benchmark", "condition", "budget", "press", "example", "cluster", "unit", "score"]
    columns += ["failed", "output"]
    frame = pd.DataFrame(records, columns=[*columns, "digits", "ceiling"])
    if frame.duplicated(["metric", "condition", "budget", "press", "example"]).any():
        raise ValueError("an example appears twice for one condition, budget and press: the runs overlap")
    seen, repeated = set(), set()
    for (metric, condition), group in frame.groupby(["metric", "condition"], sort=False):
        held = (metric, frozenset(group["row"]))
        repeated |= {(metric, condition)} if held in seen else set()
        seen.add(held)
    keep = [key not in repeated for key in zip(frame["metric"], frame["condition"], strict=True)]
    return frame[keep].drop(columns="row").reset_index(drop=True)


PRIMARY = "primary"  # the comparisons at the tallied conditions: each example counted once
SUBGROUPS = "sub-conditions (exploratory)"  # those at conditions that share their examples with a tallied one
VERDICTS = ("win", "tie", "loss")  # the comparisons a test decides; the tallies count these
DECIDED = (*VERDICTS, NO_HEADROOM)


def baselines(reference: str) -> list[tuple[str, str]]:
    """What every press is paired with: (column prefix, press), the reference, then the full cache unless it is the
    reference."""
    return [("", reference)] + ([("full_", FULL_CACHE)] if reference != FULL_CACHE else [])


def held_reference(presses: list[str], reference: str) -> str:
    """The press a run's scorecard compares with: ``reference`` where the run holds it, else the full cache, else
    the run's first press (``presses`` in the run's order)."""
    if reference in presses or not presses:
        return reference
    return FULL_CACHE if FULL_CACHE in presses else presses[0]


def presses_of(table: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(table["press"]))


def absent_name(press: str) -> str:
    """``press`` as "this run holds no ..." names it."""
    return "full cache" if press == FULL_CACHE else press


def baseline_name(against: str) -> str:
    return "the full cache" if against == FULL_CACHE else against


def with_metric(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame built without ``scores_frame``: its one metric a score of its digits and ceiling, one benchmark,
    every example its own cluster."""
    if "cluster" not in frame:
        frame = frame.assign(cluster=frame["example"], unit="example")
    if "metric" in frame:
        return frame
    metrics = [
        Metric("score", "score", int(d), float(c)) for d, c in zip(frame["digits"], frame["ceiling"], strict=True)
    ]
    return frame.assign(metric=metrics, benchmark="")


def summarize(
    frame: pd.DataFrame, reference: str, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> pd.DataFrame:
    """Per (metric, condition, budget, press): mean, 95% bootstrap interval, n, failed cells, and the paired
    difference on the examples both ran against ``reference`` at the same condition and budget (``diff``,
    ``diff_low``, ``diff_high``, ``verdict``, the bootstrap's ``p``, the minimum detectable difference ``mde``, and
    after Holm's correction over the metric's comparisons ``holm_p`` and ``holm_verdict``) and against the full
    cache (``full_``...); ``tallied``: whether the condition's examples are disjoint from every earlier tallied
    condition's of its metric, so that tallies count each example once.

    A verdict is "identical" when both sides gave the same output in every pair (where a metric records no output:
    the same value), "no signal" when both scored the floor (or both the ceiling) in every pair, or different
    outputs the same score in every pair, "too few" under ``MIN_PAIRS`` pairs (its interval still given from two
    pairs), else win, tie (the interval contains 0) or loss in the metric's direction; "reference" for the side
    compared with, "-" with nothing to compare."""
    frame = with_metric(frame)
    reference = held_reference(presses_of(frame), reference)
    keys = ["metric", "condition", "budget", "press"]
    lines = []
    for (metric, condition, budget, press), group in frame.groupby(keys, sort=False):
        ran = group.dropna(subset=["score"])
        line = {"metric": metric, "condition": condition, "budget": budget, "press": press, "n": len(ran)}
        line |= {"clusters": ran["cluster"].nunique(), "unit": group["unit"].iloc[0]}
        line |= {"failed": int(group["failed"].sum()), "digits": int(group["digits"].iloc[0])}
        if len(ran):
            interval = cluster_bootstrap(ran["score"].to_numpy(), ran["cluster"].to_numpy(), resamples, seed)
            line |= {"mean": interval.mean, "low": interval.low, "high": interval.high}
        lines.append(line)
    columns = [*keys, "n", "clusters", "unit", "failed", "digits", "mean", "low", "high"]
    summary = pd.DataFrame(lines).reindex(columns=columns)
    cells = {key: group.set_index("example") for key, group in frame.groupby(keys, sort=False)}
    for prefix, against in baselines(reference):
        summary[f"{prefix}verdict"] = ["reference" if press == against else "-" for press in summary["press"]]
        for name in COMPARED:
            if name != "verdict":
                summary[f"{prefix}{name}"] = np.nan
        summary[f"{prefix}test"] = None
        for index, line in summary.iterrows():
            base_budget = FULL_CACHE if against == FULL_CACHE else line["budget"]
            base = cells.get((line["metric"], line["condition"], base_budget, against))
            if line["press"] in (against, FULL_CACHE) or base is None:
                continue
            cell = cells[line["metric"], line["condition"], line["budget"], line["press"]]
            if against == FULL_CACHE:  # the full cache ran every example; a budget's cell may hold only some
                base = base[base.index.isin(cell.index)]
            label = f"{line['condition']}, {line['budget']}, {line['press']} against {against}"
            verdict, difference = compare(cell, base, label, resamples, seed, line["metric"].higher_is_better)
            summary.loc[index, f"{prefix}verdict"] = verdict
            if difference is not None:
                for name, value in zip(DIFFERENCE_FIELDS, difference_fields(difference), strict=True):
                    summary.at[index, f"{prefix}{name}"] = value
    tallied = tallied_conditions(frame)
    summary["tallied"] = [key in tallied for key in zip(summary["metric"], summary["condition"], strict=True)]
    summary["family"] = np.where(summary["tallied"], PRIMARY, SUBGROUPS)
    with_holm(summary, [prefix for prefix, _ in baselines(reference)], seed)
    with_headroom(summary, reference)
    if reference == FULL_CACHE:  # the pairing with the full cache is the pairing with the reference
        for name in COMPARED:
            summary[f"full_{name}"] = summary[name]
    return summary


DIFFERENCE_FIELDS = ("diff", "diff_low", "diff_high", "p", "p_error", "mde", "test")


def difference_fields(difference: Difference) -> tuple[object, ...]:
    """``DIFFERENCE_FIELDS`` of ``difference``, in that order (``test``: its ``Permutation``, which Holm may
    redraw; no file holds it)."""
    return (
        difference.mean,
        difference.low,
        difference.high,
        difference.p,
        difference.p_error,
        difference.detectable,
        difference.test,
    )


def with_headroom(summary: pd.DataFrame, reference: str) -> None:
    """In place: where the reference ties the full cache (tie, identical or no signal) at a (metric, condition,
    budget), every tie against the reference there reads ``NO_HEADROOM``; where the reference loses to it, each
    press's difference against the reference as a share of that loss (``cost_share``: (press - reference) /
    (full - reference), 1 where a press recovers all of it)."""
    summary["cost_share"] = np.nan
    if reference == FULL_CACHE:
        return
    keys = ["metric", "condition", "budget"]
    for _, group in summary.groupby(keys, sort=False):
        base = group[group["press"] == reference]
        if base.empty:
            continue
        standing, cost = base["full_verdict"].iloc[0], -base["full_diff"].iloc[0]
        others = group.index[group["press"] != reference]
        if standing in ("tie", "identical", "no signal"):
            for column in ("verdict", "holm_verdict"):
                ties = [i for i in others if summary.loc[i, column] == "tie"]
                summary.loc[ties, column] = NO_HEADROOM
        elif standing == "loss" and cost:
            summary.loc[others, "cost_share"] = summary.loc[others, "diff"] / cost


def with_holm(table: pd.DataFrame, prefixes: list[str], seed: int = DEFAULT_SEED) -> None:
    """``holm_p`` and ``holm_verdict`` (per prefix) in place: Holm's correction over every win / tie / loss of one
    metric and ``family`` where the table has one (all prefixes together); other lines keep their verdict."""
    for prefix in prefixes:
        table[f"{prefix}holm_verdict"] = table[f"{prefix}verdict"]
        table[f"{prefix}holm_p"] = float("nan")  # where nothing is tested (every pair identical, say)
    keys = ["metric", "family"] if "family" in table else ["metric"]
    for (metric, *_), group in table.groupby(keys, sort=False):
        tested = [(i, p) for p in prefixes for i in group.index if group.loc[i, f"{p}verdict"] in VERDICTS]
        settle(table, tested, seed)
        adjusted = holm([float(table.loc[i, f"{p}p"]) for i, p in tested])
        for (index, prefix), value in zip(tested, adjusted, strict=True):
            difference = table.loc[index, f"{prefix}diff"]
            table.loc[index, f"{prefix}holm_p"] = value
            table.loc[index, f"{prefix}holm_verdict"] = holm_verdict(difference, value, metric.higher_is_better)


def settle(table: pd.DataFrame, tested: list[tuple[int, str]], seed: int) -> None:
    """In place: the family ``tested``'s Monte Carlo p-values redrawn until the Monte Carlo error leaves no Holm
    decision open (``settled``), their ``p`` and ``p_error`` updated; the unadjusted verdicts stay as drawn first
    only where the redraw does not move p across 0.05."""
    column = [(i, p, table.loc[i, f"{p}test"]) for i, p in tested if f"{p}test" in table]
    known = [(i, p, test) for i, p, test in column if test is not None]
    for (index, prefix, before), after in zip(known, settled([t for _, _, t in known], seed), strict=True):
        if after is not before:
            table.at[index, f"{prefix}test"] = after
            table.loc[index, [f"{prefix}p", f"{prefix}p_error"]] = (after.p, after.error)
            better = table.loc[index, "metric"].higher_is_better if "metric" in table else True
            table.loc[index, f"{prefix}verdict"] = holm_verdict(table.loc[index, f"{prefix}diff"], after.p, better)


def tallied_conditions(frame: pd.DataFrame) -> set[tuple[Metric, str]]:
    """The (metric, condition)s whose examples no earlier tallied condition of the metric holds, in the scorecard's
    order (so LoCoMo tallies "overall (1-4)" and "adversarial (5)" and lists the rest untallied)."""
    tallied = set()
    for metric, rows in frame.groupby("metric", sort=False):
        taken: set = set()
        for condition, group in rows.groupby("condition", sort=False):
            examples = set(zip(group["benchmark"], group["example"], strict=True))
            if not examples & taken:
                tallied.add((metric, condition))
                taken |= examples
    return tallied


def compare(
    cell: pd.DataFrame, base: pd.DataFrame, label: str, resamples: int, seed: int, higher_is_better: bool = True
) -> tuple[str, Difference | None]:
    """The verdict of ``cell`` against ``base`` (both indexed by example; ``cluster``: each example's unit) and
    the paired difference behind it: win or loss where the sign-flip test's p is under 5%, else tie; "too few"
    under ``MIN_PAIRS`` clusters (its interval still given, from two pairs)."""
    pairs = cell.join(base, rsuffix="_base", how="inner").dropna(subset=["score", "score_base"])
    outputs = pairs["output"].notna().all()
    if len(pairs) and outputs and (pairs["output"] == pairs["output_base"]).all():
        return "identical", None
    scores = np.concatenate([pairs["score"].to_numpy(), pairs["score_base"].to_numpy()])
    bounded = len(pairs) and not np.isnan(pairs["ceiling"].iloc[0])
    if bounded and (np.all(scores == 0) or np.all(scores == pairs["ceiling"].iloc[0])):
        return "no signal", None
    if len(pairs) and (pairs["score"] == pairs["score_base"]).all():  # a [0, 0] interval: never a tie
        return ("no signal" if outputs else "identical"), None
    if len(pairs) < MIN_EXAMPLES_FOR_INTERVAL:
        return TOO_FEW, None
    clusters = dict(cell["cluster"]) if "cluster" in cell else None
    difference = paired(dict(cell["score"]), dict(base["score"]), label, resamples, seed, clusters)
    if difference.clusters < MIN_PAIRS:
        return TOO_FEW, difference
    return holm_verdict(difference.mean, difference.p, higher_is_better), difference


def paired_line(
    cell: pd.DataFrame,
    base: pd.DataFrame,
    means: tuple[str, str],
    label: str,
    resamples: int,
    seed: int,
    higher_is_better: bool,
) -> dict:
    """``compare``'s verdict of ``cell`` against ``base`` as a table line's fields: the pairs' count, both means
    over them (named ``means``), the verdict, and the paired difference with its interval, p-value and MDE where
    there is one."""
    verdict, difference = compare(cell, base, label, resamples, seed, higher_is_better)
    both = cell.join(base, rsuffix="_base", how="inner").dropna(subset=["score", "score_base"])
    line = {"n": len(both), means[0]: both["score"].mean(), means[1]: both["score_base"].mean(), "verdict": verdict}
    line["clusters"] = both["cluster"].nunique() if "cluster" in both else len(both)
    if difference is not None:
        line |= dict(zip(DIFFERENCE_FIELDS, difference_fields(difference), strict=True))
    return line


def contrast_table(
    benchmark: Benchmark,
    rows: list[dict],
    prefix: str = "",
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> pd.DataFrame:
    """Per contrast, budget and press, on the benchmark's first metric: both conditions' means over the matched
    pairs, the paired difference with its interval, p-value and minimum detectable difference, a verdict as
    ``compare`` gives it (win: the first condition is better) and one after Holm's correction over the table."""
    metric = benchmark.metrics[0]
    lines = []
    for contrast in benchmark.contrasts:
        frame = _contrast_frame(benchmark, contrast, rows)
        for (budget, press), group in frame.groupby(["budget", "press"], sort=False):
            first, second = (group[group["side"] == side].set_index("pair") for side in (0, 1))
            label = f"{contrast.name}, {budget}, {press}"
            line = {"contrast": prefix + contrast.name, "budget": budget, "press": press}
            line |= paired_line(
                first, second, ("minuend", "subtrahend"), label, resamples, seed, metric.higher_is_better
            )
            lines.append(line | {"metric": metric, "digits": metric.digits, "note": contrast.note})
    columns = ["contrast", "budget", "press", "n", "clusters", "minuend", "subtrahend", "diff", "diff_low"]
    columns += ["diff_high", "verdict", "p", "p_error", "mde", "metric", "digits", "note", "test"]
    table = pd.DataFrame(lines).reindex(columns=columns)
    with_holm(table, [""], seed)
    return table


def _contrast_frame(benchmark: Benchmark, contrast: Contrast, rows: list[dict]) -> pd.DataFrame:
    metric = benchmark.metrics[0]
    records = [
        {
            "side": side,
            "budget": row["budget_label"].removesuffix(OVER_THE_CONTEXT),  # the two of a pair may differ in length
            "press": row["press"],
            "pair": contrast.pair(row),
            "cluster": str(benchmark.cluster_of(row)) if benchmark.cluster else str(contrast.pair(row)),
            "score": np.nan if row.get("error") else row[metric.field] * metric.scale,
            "output": row.get(metric.output) if metric.output else None,
            "ceiling": metric.scale if metric.bounded else np.nan,
        }
        for row in rows
        if row.get("error") or row.get(metric.field) is not None
        for side, condition in enumerate((contrast.minuend, contrast.subtrahend))
        if condition in benchmark.conditions(row)
    ]
    return pd.DataFrame(records, columns=["side", "budget", "press", "pair", "cluster", "score", "output", "ceiling"])


PRESS_CONTRAST_COLUMNS = ["metric", "condition", "budget", "press", "baseline", "n", "clusters", "press_mean"]
PRESS_CONTRAST_COLUMNS += ["baseline_mean"]


def press_contrast_table(
    frame: pd.DataFrame,
    contrasts: tuple[PressContrast, ...],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> pd.DataFrame:
    """Per metric, condition and budget, every spec of each contrast's press that ran there (but a spec that is itself
    a baseline, as RMM's random-weight control is) against its baseline on the examples both ran (``frame``:
    ``scores_frame``'s): both means over those pairs, the paired difference with its interval, p-value and minimum
    detectable difference, the verdict as ``compare`` gives it (win: the press is better, in the metric's direction)
    and one after Holm's correction over the metric's press contrasts."""
    keys = ["metric", "condition", "budget", "press"]
    cells = {key: group.set_index("example") for key, group in frame.groupby(keys, sort=False)}
    baselines = {FULL_CACHE, *(contrast.baseline for contrast in contrasts)}
    lines = []
    for contrast in contrasts:
        for (metric, condition, budget, press), cell in cells.items():
            base = cells.get((metric, condition, budget, contrast.baseline))
            if base is None or press in baselines or plan_spec(press).name != contrast.press:
                continue
            label = f"{condition}, {budget}, {press} against {contrast.baseline}"
            line = dict(zip(keys, (metric, condition, budget, press), strict=True)) | {"baseline": contrast.baseline}
            means = ("press_mean", "baseline_mean")
            line |= paired_line(cell, base, means, label, resamples, seed, metric.higher_is_better)
            lines.append(line | {"digits": metric.digits})
    columns = [*PRESS_CONTRAST_COLUMNS, "diff", "diff_low", "diff_high", "verdict", "p", "p_error", "mde", "digits"]
    columns += ["test"]
    table = pd.DataFrame(lines).reindex(columns=columns)
    with_holm(table, [""], seed)
    return table


def press_contrast_section(table: pd.DataFrame) -> list[str]:
    """The markdown of the press contrasts: per metric, one line per (condition, budget, press, baseline)."""
    lines = ["", "## Presses against baselines, paired", ""]
    lines += [
        "Each press against the baseline at the same condition and budget, paired by example; win: the press is "
        "better in the metric's direction. Exploratory: p, MDE as above; Holm over these comparisons of the metric, "
        "a family of their own, apart from the primary one."
    ]
    for metric, group in table.groupby("metric", sort=False):
        lines += ["", f"### {metric.label}", ""]
        lines += [
            "| condition | budget | press | baseline | press mean | baseline mean | difference | n | MDE | p | verdict "
            "| Holm p | Holm |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for _, line in group.iterrows():
            digits = int(line["digits"])
            difference = interval_text(line["diff"], line["diff_low"], line["diff_high"], digits, True) or "-"
            means = [number_text(line[side], digits) for side in ("press_mean", "baseline_mean")]
            cells = [line["condition"], line["budget"], line["press"], line["baseline"], *means, difference, line["n"]]
            cells += [number_text(line["mde"], digits), p_text(line["p"], line["p_error"]), line["verdict"]]
            cells += [p_text(line["holm_p"]), line["holm_verdict"]]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


def contrast_section(table: pd.DataFrame) -> list[str]:
    """The markdown of the contrasts: one table per contrast."""
    lines = []
    for name, group in table.groupby("contrast", sort=False):
        first, second = name.rpartition(": ")[2].split(" - ", 1)  # the combined scorecard prefixes its benchmark
        metric = group["metric"].iloc[0]
        lines += ["", f"## {name}, paired", ""]
        lines += [
            f"Each {first} question against the {second} question of its pair (same press, same budget) on "
            f"{metric.label}; win: {first} is better. p and MDE as above; Holm over the contrasts, a family of their "
            "own." + (f" {group['note'].iloc[0]}" if group["note"].iloc[0] else ""),
            "",
        ]
        lines += [
            f"| budget | press | {first} | {second} | difference | n | MDE | p | verdict | Holm |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for _, line in group.iterrows():
            digits = int(line["digits"])
            difference = (
                "-"
                if pd.isna(line["diff"])
                else interval_text(line["diff"], line["diff_low"], line["diff_high"], digits, True)
            )
            means = [f"{line[side]:.{digits}f}" for side in ("minuend", "subtrahend")]
            detectable = number_text(line["mde"], digits)
            cells = [line["budget"], line["press"], *means, difference, line["n"], detectable]
            cells += [p_text(line["p"], line["p_error"]), line["verdict"], line["holm_verdict"]]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


def wins_ties_losses(summary: pd.DataFrame, prefix: str = "", holm: bool = False) -> pd.DataFrame:
    """Per press, how many tallied conditions (``tallied``: each example counted once) it wins, ties and loses
    against the reference (``prefix`` "full_": against the full cache; ``holm``: after Holm's correction);
    "identical", "no signal" and "too few" are no comparison and are not counted."""
    column = f"{prefix}holm_verdict" if holm else f"{prefix}verdict"
    counted = summary["tallied"].fillna(False).astype(bool) if "tallied" in summary else True
    verdicts = summary[summary[column].isin(DECIDED) & counted].replace({column: {NO_HEADROOM: "tie"}})
    counts = pd.crosstab(verdicts["press"], verdicts[column]).reindex(columns=list(VERDICTS), fill_value=0)
    return counts.reindex(list(dict.fromkeys(verdicts["press"])))


def comparisons(summary: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Every comparison with an interval (win, tie, loss, and "too few" from two pairs) in long form: against the
    reference, then against the full cache."""
    parts = []
    for prefix, against in baselines(reference):
        drawn = summary[f"{prefix}verdict"].isin(DECIDED) | summary[f"{prefix}diff"].notna()
        renamed = {f"{prefix}{name}": name for name in COMPARED}
        chosen = summary[drawn & (summary[f"{prefix}verdict"] != "reference")]
        part = chosen[["metric", "condition", "budget", "press", "n", "digits", *renamed]].rename(columns=renamed)
        parts.append(part.assign(against=against))
    return pd.concat(parts, ignore_index=True)


def other_verdicts(summary: pd.DataFrame, prefix: str) -> str:
    """How many pairs of columns got no win / tie / loss, and why."""
    counts = summary[f"{prefix}verdict"].value_counts()
    named = [f"{counts[v]} {v}" for v in ("identical", "no signal", TOO_FEW) if v in counts]
    return (
        f"Not compared: {', '.join(named)} (identical: the same output in every pair; no signal: both at the floor, "
        f"both at the ceiling, or the same score in every pair; too few: under {MIN_PAIRS} clusters (pairs where "
        "none share a unit), their interval listed without a verdict)."
        if named
        else ""
    )


def number_text(value: float, digits: int) -> str:
    return "-" if pd.isna(value) else f"{value:.{digits}f}"


def p_text(value: float, error: float = 0.0) -> str:
    """A p-value to 3 decimals (under 0.0005, ``<0.001``), with its Monte Carlo error where it has one."""
    if pd.isna(value):
        return "-"
    text = "<0.001" if value < 0.0005 else f"{value:.3f}"
    return text + (f" ± {error:.3f}" if not pd.isna(error) and error > 0 else "")


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


def metrics_of(summary: pd.DataFrame) -> list[Metric]:
    return [metric for metric in dict.fromkeys(summary["metric"]) if isinstance(metric, Metric)]


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
    press_contrasts: pd.DataFrame | None = None,
    tables: dict[str, list[str]] | None = None,
) -> None:
    """``scorecard.csv`` (long form), ``scorecard.md`` (per metric, conditions x budgets by press, then the
    differences against the reference with wins / ties / losses), ``scorecard.png`` (absolute values) and
    ``forest.png``. Every press and budget of ``summary`` is in each: ``presses`` and ``budgets`` (a run's asked
    grid) come first; ``contrasts`` (``contrast_table``) and ``press_contrasts`` (``press_contrast_table``), when
    they hold any, go to ``contrasts.csv`` and ``press_contrasts.csv`` and a section each; ``tables`` (a title per
    list of conditions) splits the score tables, one per title with the presses and budgets of its conditions
    alone; ``appendix`` (markdown lines) closes the markdown. Each file is written new and renamed into place; a
    link where one belongs is refused before any is written (``evaluation.runs.files``)."""
    refuse_links(output, SCORECARD_FILES)
    output.mkdir(parents=True, exist_ok=True)
    columns = ["metric", "condition", "budget", "press", "mean", "low", "high", "n", "clusters", "failed"]
    columns += [f"{prefix}{name}" for prefix in ("", "full_") for name in COMPARED]
    columns += ["cost_share", "tallied", "family"]
    with replaced(output / "scorecard.csv") as staging:
        summary.reindex(columns=columns).assign(metric=summary["metric"].map(metric_name)).to_csv(staging, index=False)
    compared_with = held_reference(presses_of(summary), reference)
    presses = list(dict.fromkeys([*(presses or []), *summary["press"]]))  # the asked ones first, then any stored
    budgets = [b for b in dict.fromkeys([*(budgets or []), *summary["budget"]]) if b != FULL_CACHE]
    lines = [f"# {title}", "", note, *reference_note(reference, compared_with), "", "![scores](scorecard.png)"]
    if tables is None:
        lines += score_tables(summary, presses, budgets, "##")
    for heading, conditions in (tables or {}).items():
        chosen = summary[summary["condition"].isin(conditions)]
        ran = [press for press in presses if press in set(chosen["press"])]
        held = [budget for budget in budgets if budget in set(chosen["budget"])]
        lines += ["", f"## {heading}", *score_tables(chosen, ran, held, "###")]
    lines += families_section(summary, compared_with, contrasts, press_contrasts)
    for prefix, against in baselines(compared_with):
        lines += comparison_section(summary, prefix, against)
    sections = (
        (contrasts, "contrasts.csv", ["digits", "note", "test"], contrast_section),
        (press_contrasts, "press_contrasts.csv", ["digits", "test"], press_contrast_section),
    )
    for table, name, internal, section in sections:
        if table is not None and not table.empty:
            with replaced(output / name) as staging:
                table.drop(columns=internal).assign(metric=table["metric"].map(metric_name)).to_csv(
                    staging, index=False
                )
            lines += section(table)
    write_atomically(output / "scorecard.md", "\n".join(lines + (appendix or [])) + "\n")
    plot_scores(output / "scorecard.png", summary, presses, budgets)
    plot_forest(output / "forest.png", summary, compared_with, presses)


def reference_note(asked: str, held: str) -> list[str]:
    """Why the comparisons are against ``held`` where the run holds no ``asked`` reference."""
    if held == asked:
        return []
    return ["", f"This run holds no {absent_name(asked)}: every press is compared with {baseline_name(held)}."]


def families_section(
    summary: pd.DataFrame,
    reference: str,
    contrasts: pd.DataFrame | None,
    press_contrasts: pd.DataFrame | None,
) -> list[str]:
    """The markdown that names the unit pairs are clustered by and declares every Holm family: its comparisons
    and their count."""
    units = list(dict.fromkeys(summary["unit"].dropna())) if "unit" in summary else []
    lines = ["", "## Units and Holm families", ""]
    if (summary["clusters"] < summary["n"]).any():
        lines += [
            f"Pairs share a unit ({', '.join(units)}): every interval is a bootstrap of these clusters, every test "
            'flips the signs of their summed differences, n counts pairs and clusters, and "too few" means under '
            f"{MIN_PAIRS} clusters.",
            "",
        ]
    elif units:
        lines += [f'Unit: the {", ".join(units)}, each pair its own; "too few" means under {MIN_PAIRS} pairs.', ""]
    against = " and ".join(dict.fromkeys([baseline_name(reference), "the full cache"]))
    for metric in metrics_of(summary):
        for family, where in ((PRIMARY, "the tallied conditions"), (SUBGROUPS, "the other conditions")):
            chosen = summary[(summary["metric"] == metric) & (summary["family"] == family)]
            tested = sum(int(chosen[f"{p}holm_p"].notna().sum()) for p, _ in baselines(reference))
            conditions = ", ".join(dict.fromkeys(chosen["condition"]))
            if conditions:
                lines.append(
                    f"- {family.capitalize()}, {metric.name}: the {tested} tested comparisons of each press against "
                    f"{against} at every budget of {where} ({conditions})."
                )
    for table, name in ((press_contrasts, "press against press"), (contrasts, "the paired contrasts")):
        if table is not None and not table.empty:
            for metric, group in table.groupby("metric", sort=False):
                lines.append(
                    f"- Exploratory, {metric_name(metric)}: the {int(group['holm_p'].notna().sum())} tested "
                    f"comparisons of {name}, a family of their own."
                )
    return lines


def metric_name(metric: object) -> str:
    return metric.name if isinstance(metric, Metric) else ""


def score_tables(summary: pd.DataFrame, presses: list[str], budgets: list[str], level: str) -> list[str]:
    """The markdown score tables of ``summary``, one per metric, each under a heading of ``level`` when there are
    several."""
    lines: list[str] = []
    metrics = metrics_of(summary)
    for metric in metrics:
        chosen = summary[summary["metric"] == metric]
        lines += ["", *([f"{level} {metric.name} ({metric.unit})", ""] if len(metrics) > 1 else [])]
        lines += [f"Metric: {metric.label}.", "", *score_table(chosen, presses, budgets)]
    return lines


def score_table(summary: pd.DataFrame, presses: list[str], budgets: list[str]) -> list[str]:
    """The markdown table of one metric: a row per (condition, budget), a column per press."""
    table = summary.assign(text=summary.apply(cell_text, axis=1))
    full = table[table["press"] == FULL_CACHE].set_index("condition")["text"]
    rows = []
    for condition in dict.fromkeys(table["condition"]):
        compressed = table[(table["condition"] == condition) & (table["press"] != FULL_CACHE)]
        for budget in [b for b in budgets if b in set(compressed["budget"])] or budgets:
            cells = table[(table["condition"] == condition) & (table["budget"] == budget)].set_index("press")["text"]
            texts = [full.get(condition, "-") if press == FULL_CACHE else cells.get(press, "-") for press in presses]
            rows.append(f"| {condition} | {budget} | " + " | ".join(texts) + " |")
    return ["| condition | budget | " + " | ".join(presses) + " |", "|---|---|" + "---|" * len(presses), *rows]


def comparison_section(summary: pd.DataFrame, prefix: str, against: str) -> list[str]:
    """The markdown of one set of paired comparisons, per metric: the tallies (each example counted once), then
    one line per comparison with an interval."""
    name, metrics = baseline_name(against), metrics_of(summary)
    lines = ["", f"## Against {name}", ""]
    if against not in set(summary["press"]):
        return [*lines, f"This run holds no {absent_name(against)} (add `{against}` to --presses to compare with it)."]
    if prefix == "":
        lines += ["![differences](forest.png)", ""]
    lines += [POWER_NOTE]
    for metric in metrics:
        chosen = summary[summary["metric"] == metric]
        lines += ["", *([f"### {metric.name} ({metric.unit})", ""] if len(metrics) > 1 else [])]
        lines += metric_comparisons(chosen, prefix, against, metric)
    return lines


def metric_comparisons(summary: pd.DataFrame, prefix: str, against: str, metric: Metric) -> list[str]:
    counts, name = wins_ties_losses(summary, prefix), baseline_name(against)
    listed = summary[summary[f"{prefix}verdict"].isin(DECIDED) | summary[f"{prefix}diff"].notna()]
    listed = listed[listed[f"{prefix}verdict"] != "reference"]
    if listed.empty:
        return [other_verdicts(summary, prefix) or f"Nothing to compare: no other press ran where {name} ran."]
    lines = []
    if not counts.empty:
        corrected = wins_ties_losses(summary, prefix, holm=True).reindex(counts.index, fill_value=0)
        lines += [
            f"Wins / ties / losses against {name} on {metric.label} (a tie: the sign-flip test's p is 0.05 or "
            "more), and after Holm's correction over the primary family:",
            "",
        ]
        lines += [
            f"- {press}: {row['win']} / {row['tie']} / {row['loss']} (Holm: "
            f"{corrected.loc[press, 'win']} / {corrected.loc[press, 'tie']} / {corrected.loc[press, 'loss']})"
            for press, row in counts.iterrows()
        ]
        lines += overlap_note(summary, prefix)
    lines += headroom_note(summary) if prefix == "" else []
    lines += ["", other_verdicts(summary, prefix)] if other_verdicts(summary, prefix) else []
    shares = prefix == "" and summary["cost_share"].notna().any()
    lines += [
        "",
        f"| condition | budget | press | difference vs {against} | n | MDE | p | verdict | Holm p | Holm |"
        + (" share of its cost |" if shares else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if shares else ""),
    ]
    for _, line in listed.iterrows():
        digits = int(line["digits"])
        diff = [line[f"{prefix}diff"], line[f"{prefix}diff_low"], line[f"{prefix}diff_high"]]
        difference = interval_text(*diff, digits, signed=True)
        cells = [line["condition"], line["budget"], line["press"], difference, pairs_text(line)]
        cells += [number_text(line[f"{prefix}mde"], digits), p_text(line[f"{prefix}p"], line[f"{prefix}p_error"])]
        cells += [line[f"{prefix}verdict"], p_text(line[f"{prefix}holm_p"]), line[f"{prefix}holm_verdict"]]
        cells += [share_text(line["cost_share"])] if shares else []
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


def pairs_text(line: pd.Series) -> str:
    """n, with its clusters where pairs share a unit: ``180 (10 conversations)``."""
    unit = line.get("unit", "example")
    if pd.isna(line.get("clusters")) or unit == "example" or line["clusters"] == line["n"]:
        return str(line["n"])
    return f"{line['n']} ({int(line['clusters'])} {unit}s)"


def share_text(value: float) -> str:
    return "-" if pd.isna(value) else f"{value:+.0%}"


def headroom_note(summary: pd.DataFrame) -> list[str]:
    """Where the reference ties the full cache, and what the shares of its cost mean."""
    spared = summary[(summary["verdict"] == NO_HEADROOM) | (summary["holm_verdict"] == NO_HEADROOM)]
    places = list(dict.fromkeys(zip(spared["condition"], spared["budget"], strict=True)))
    lines = []
    if places:
        named = "; ".join(f"{condition}, {budget}" for condition, budget in places)
        lines += [
            "",
            f"No headroom ({named}): the reference ties the full cache there, so the budget leaves no room for a win "
            f'against it; a tie there reads "{NO_HEADROOM}" and says nothing about the presses.',
        ]
    if summary["cost_share"].notna().any():
        lines += [
            "",
            "Share of its cost: where the reference loses to the full cache, a press's difference against it as a "
            "share of that loss ((press - reference) / (full - reference); +100%: all of it recovered).",
        ]
    return lines


def overlap_note(summary: pd.DataFrame, prefix: str) -> list[str]:
    """Which conditions the tallies leave out because their examples are already counted."""
    compared = summary[summary[f"{prefix}verdict"].isin(DECIDED)]
    counted = compared["tallied"].fillna(False).astype(bool)
    left_out = list(dict.fromkeys(compared.loc[~counted, "condition"]))
    if not left_out:
        return []
    kept = ", ".join(dict.fromkeys(compared.loc[counted, "condition"]))
    return [
        "",
        f"The tallies count each example once: they count {kept}; {', '.join(left_out)} share examples with "
        "those and are listed below, not tallied.",
    ]


def save_figure(figure: Figure, path: Path, dpi: int | None = 110) -> Figure:
    """``figure`` as the picture ``path`` (its format by the suffix), a new file renamed over it (``replaced``);
    ``dpi`` None: the figure's own."""
    with replaced(path) as staging:
        figure.savefig(staging, dpi=dpi)
    return figure


def press_markers(presses: list[str]) -> dict[str, str]:
    """Each press's marker, the same in every picture of a scorecard: by its place among ``presses`` (the run's
    asked presses first), the full cache left out (drawn as a line)."""
    compressed = [press for press in dict.fromkeys(presses) if press != FULL_CACHE]
    return {press: MARKERS[i % len(MARKERS)] for i, press in enumerate(compressed)}


def legend_handles(presses: list[str], markers: dict[str, str]) -> list[Line2D]:
    return [Line2D([], [], marker=markers[press], linestyle="", color="black", label=press) for press in presses]


def plot_scores(path: Path, summary: pd.DataFrame, presses: list[str], budgets: list[str]) -> Figure:
    """Absolute values against budget, one panel per (metric, condition), its axes labelled with the metric's
    unit and direction: a line per press with its interval, the full cache a dashed reference line; the legend
    sits below the panels."""
    panels = list(dict.fromkeys(zip(summary["metric"], summary["condition"], strict=True)))
    compressed = [press for press in presses if press != FULL_CACHE]
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    legend_rows = -(-len(presses) // 4)
    figure = Figure(figsize=(3.8 * columns + 0.6, 2.9 * rows + 0.35 * legend_rows + 0.4), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False)
    colors = {press: f"C{i % 10}" for i, press in enumerate(compressed)}
    markers = press_markers(presses)
    for axis, (metric, condition) in zip(axes.flat, panels, strict=False):
        chosen = summary[(summary["metric"] == metric) & (summary["condition"] == condition)]
        full = chosen[chosen["press"] == FULL_CACHE]
        if len(full) and not pd.isna(full["mean"].iloc[0]):
            axis.axhline(full["mean"].iloc[0], color="black", linestyle="--", linewidth=1)
        for i, press in enumerate(compressed):
            line = chosen[chosen["press"] == press].set_index("budget").reindex(budgets)
            x = np.arange(len(budgets)) + (i - (len(compressed) - 1) / 2) * 0.04
            spread = [(line["mean"] - line["low"]).to_numpy(), (line["high"] - line["mean"]).to_numpy()]
            errors = [np.clip(side, 0, None) for side in spread]  # a percentile interval may leave out its mean
            axis.errorbar(
                x,
                line["mean"].to_numpy(),
                yerr=errors,
                marker=markers[press],
                color=colors[press],
                capsize=2,
                markersize=4,
                linewidth=1,
            )
        axis.set_title(condition, fontsize=8)
        axis.set_xticks(range(len(budgets)), budgets, fontsize=7)
        axis.set_xlabel("budget (cache kept)", fontsize=7)
        axis.set_ylabel(wrapped(f"{metric.name} ({metric.unit}; {metric.direction})"), fontsize=7)
        axis.tick_params(axis="y", labelsize=7)
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    handles = [Line2D([], [], color="black", linestyle="--", label="full cache")] if FULL_CACHE in presses else []
    handles += [Line2D([], [], marker=markers[press], color=colors[press], label=press) for press in compressed]
    figure.legend(handles=handles, loc="outside lower center", ncols=min(4, len(handles)), fontsize=7, frameon=False)
    return save_figure(figure, path)


def wrapped(text: str, width: int = 34) -> str:
    """An axis label broken into lines of about ``width`` characters, at spaces."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + len(word) < width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


def plot_forest(path: Path, summary: pd.DataFrame, reference: str, order: list[str] | None = None) -> Figure:
    """The paper's Figure 3 as a forest plot: a row per (condition, budget), a marker per press (its shape in the
    legend, as in the scores' picture: ``press_markers`` of ``order``, the run's presses) at its paired difference
    with its interval, coloured by its verdict before Holm's correction (the legend says so), around a zero line. A
    panel per comparison (against the reference, then against the full cache) and metric, its axis labelled with
    the metric's unit and direction. Comparisons under ``MIN_PAIRS`` pairs are drawn hollow and grey: an interval,
    no verdict."""
    compared = comparisons(summary, reference)
    if compared.empty:  # still a picture, so that no earlier one is left standing
        figure = Figure(figsize=(6, 0.8), layout="constrained")
        figure.text(0.5, 0.5, nothing_drawn(summary, reference), ha="center", wrap=True)
        return save_figure(figure, path)
    presses = list(dict.fromkeys(compared["press"]))
    markers = press_markers([*(order or []), *summary["press"]])
    groups = list(compared.groupby(["against", "metric"], sort=False))
    heights = [len(group.groupby(["condition", "budget"])) for _, group in groups]
    legend_rows = -(-(len(presses) + 4) // 3)
    figure = Figure(
        figsize=(8.5, 0.32 * sum(heights) + 1.1 * len(heights) + 0.3 * legend_rows + 0.5), layout="constrained"
    )
    axes = figure.subplots(len(heights), 1, squeeze=False, height_ratios=[h + 2 for h in heights])[:, 0]
    for axis, ((against, metric), group) in zip(axes, groups, strict=True):
        forest_panel(axis, group, presses, markers)
        forest_labels(axis, group, against, metric)
    forest_legend(figure, compared, presses, markers)
    return save_figure(figure, path)


def forest_labels(axis: Axes, group: pd.DataFrame, against: str, metric: Metric) -> None:
    """A forest panel's title (saying so where no comparison of ``group`` has a verdict) and axis labels: the
    comparison against ``against`` and the ``metric`` with its unit and direction."""
    no_verdict = (
        f"; no verdict: every comparison has under {MIN_PAIRS} clusters" if (group["verdict"] == TOO_FEW).all() else ""
    )
    axis.set_title(f"{metric.name} against {baseline_name(against)}{no_verdict}", fontsize=8)
    axis.set_xlabel(
        f"difference against {baseline_name(against)} ({metric.name}, {metric.unit}; {metric.direction}; 95% "
        "paired bootstrap interval)",
        fontsize=7,
    )
    axis.set_ylabel("condition, budget", fontsize=7)


def forest_legend(figure: Figure, compared: pd.DataFrame, presses: list[str], markers: dict[str, str]) -> None:
    """The forest's legend below its panels: each press's marker, then the verdicts' colours (no headroom only
    where ``compared`` holds one) and the hollow grey of too few clusters."""
    verdicts = [
        Line2D([], [], marker="s", linestyle="", color=c, label=v)
        for v, c in VERDICT_COLORS.items()
        if v in VERDICTS or (v == NO_HEADROOM and (compared["verdict"] == NO_HEADROOM).any())
    ]
    verdicts.append(
        Line2D(
            [],
            [],
            marker="s",
            linestyle="",
            color=VERDICT_COLORS[TOO_FEW],
            markerfacecolor="none",
            label=f"too few (under {MIN_PAIRS} clusters): no verdict",
        )
    )
    figure.legend(
        handles=legend_handles(presses, markers) + verdicts,
        loc="outside lower center",
        ncols=3,
        fontsize=7,
        frameon=False,
        title="marker: press; colour: its verdict before Holm's correction (the scorecard gives both)",
        title_fontsize=7,
    )


def nothing_drawn(summary: pd.DataFrame, reference: str) -> str:
    """Why a forest has no comparison to draw: what the run's verdicts against its baselines are."""
    columns = [f"{prefix}verdict" for prefix, _ in baselines(reference)]
    verdicts = sorted(set(summary[columns].to_numpy().ravel()) - {"reference", "-"})
    if not verdicts:
        return f"nothing to draw: no press ran where {baseline_name(reference)} or the full cache ran"
    return f"nothing to draw: every comparison is {' or '.join(verdicts)} (the scorecard says why)"


def forest_panel(axis: Axes, group: pd.DataFrame, presses: list[str], markers: dict[str, str]) -> None:
    """One panel's rows: each press's difference and interval at each (condition, budget)."""
    rows = list(dict.fromkeys(zip(group["condition"], group["budget"], strict=True)))
    spread = 0.7 / max(len(presses), 1)
    for position, (condition, budget) in enumerate(rows):
        for i, press in enumerate(presses):
            line = group[(group["condition"] == condition) & (group["budget"] == budget) & (group["press"] == press)]
            if line.empty:
                continue
            line = line.iloc[0]
            color = VERDICT_COLORS[line["verdict"]]
            axis.errorbar(
                line["diff"],
                position + (i - (len(presses) - 1) / 2) * spread,
                xerr=[[max(0.0, line["diff"] - line["diff_low"])], [max(0.0, line["diff_high"] - line["diff"])]],
                marker=markers[press],
                color=color,
                markerfacecolor="none" if line["verdict"] == TOO_FEW else color,
                markersize=4,
                capsize=2,
                linewidth=1,
            )
    axis.axvline(0, color="black", linewidth=0.8)
    axis.set_yticks(range(len(rows)), [f"{condition}, {budget}" for condition, budget in rows], fontsize=7)
    axis.set_ylim(len(rows) - 0.5, -0.5)
    axis.tick_params(axis="x", labelsize=7)
    axis.grid(alpha=0.3, axis="x")
