"""The probe re-read by position: each scorer's share of probes with both gold facts in its top k, split by where
the older gold fact stands and by whether the model answered correctly.

Where it stands is its recency rank (1: the newest of the sixteen facts; 2 at best for the older of two), read from
the rows alone: the recency scorer's ``gold_ranks`` are the gold facts' recency ranks. Within one bin recency's own
share moves only with the newer gold fact (at top 4 it is 100% in the first bin and 0 beyond), so a scorer's rise
from the incorrectly to the correctly answered probes of one bin is not the position the bin fixes.
"""

from __future__ import annotations

from statistics import mean

import pandas as pd

from evaluation.protocols.probe.protocol import BENCHMARK, CORRECT, INCORRECT, RECENCY, ProbeRow
from evaluation.protocols.protocol import REFERENCE
from evaluation.reporting.conditions import Benchmark
from evaluation.reporting.scorecard import score_table, scores_frame, summarize

BINS = ((2, 4), (5, 8), (9, 12), (13, 16))  # the older gold fact's recency rank


def older_gold_ranks(rows: list[ProbeRow]) -> dict[int, int]:
    """Per probe with a recency row: the recency rank of its older gold fact."""
    return {row["probe"]: max(row["gold_ranks"]) for row in rows if row["press"] == RECENCY and "gold_ranks" in row}


def bin_label(rank: int) -> str:
    low, high = next(span for span in BINS if span[0] <= rank <= span[1])
    return f"older gold fact at recency rank {low}-{high}"


def split(row: ProbeRow) -> str:
    return CORRECT if row["correct"] else INCORRECT


def position_benchmark(rows: list[ProbeRow]) -> Benchmark:
    """The probe's score, its conditions the answer's correctness crossed with the older gold fact's bin."""
    ranks = older_gold_ranks(rows)

    def conditions(row: ProbeRow) -> list[str]:
        rank = ranks.get(row["probe"])
        return [] if rank is None else [f"{split(row)}, {bin_label(rank)}"]

    order = tuple(f"{answered}, {bin_label(low)}" for answered in (CORRECT, INCORRECT) for low, _ in BINS)
    return Benchmark(
        f"{BENCHMARK.name} by position",
        conditions,
        BENCHMARK.example_id,
        BENCHMARK.scale,
        BENCHMARK.digits,
        order,
        unit=BENCHMARK.unit,
        measured=(BENCHMARK.score,),
        cluster_unit=BENCHMARK.cluster_unit,
    )


def position_summary(rows: list[ProbeRow]) -> pd.DataFrame:
    """``summarize``'s table of the position benchmark, its conditions in the benchmark's order."""
    benchmark = position_benchmark(rows)
    frame = scores_frame(benchmark, rows)
    frame = frame.sort_values("condition", key=lambda c: c.map(benchmark.order.index), kind="stable")
    return summarize(frame, REFERENCE)


def position_section(rows: list[ProbeRow], presses: list[str], budgets: list[str]) -> list[str]:
    """The scorecard's markdown section: the mean rank per split, then the table."""
    ranks = older_gold_ranks(rows)
    answered = {row["probe"]: split(row) for row in rows if row["probe"] in ranks}
    means = []
    for name in (CORRECT, INCORRECT):
        held = [ranks[probe] for probe, split_name in answered.items() if split_name == name]
        if held:
            means.append(f"{mean(held):.1f} on the {len(held)} probes {name}")
    note = (
        "Each scorer's share of probes (%) with both gold facts in its top k, split by whether the model answered "
        f"correctly and by the older gold fact's recency rank (1: the newest of the {BINS[-1][1]} facts), read from "
        "the recency rows' gold ranks; each cell: mean [95% bootstrap interval over probes] (n probes). Within one "
        "bin both splits hold the older gold fact in the same few places, so a scorer's rise from the incorrectly "
        "to the correctly answered probes of a bin is not what the recency scorer finds at that k (the bins are "
        "coarse: compare their n). The older gold fact's mean recency rank: "
        + ("; ".join(means) or "no recency rows")
        + "."
    )
    table = score_table(position_summary(rows), presses, budgets) if ranks else []
    return ["", "## By the gold facts' position", "", note, "", *table]
