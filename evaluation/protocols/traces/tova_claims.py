"""The TOVA seed's claims, measured on the eviction lab's rows: per text and budget, TOVA's retained attention mass
against the seed's H2O (attention summed, its 32 newest positions protected: ``SummedH2OPolicy``), beside the
lab's ``h2o`` (KVPress's, attention averaged, with and without that window), the heavy-hitter recall the seed's
H2O wins instead, and how many of the 64 newest and of the 4 first positions ("attention sinks") each holds once
the trace is read (the seed: all of both under TOVA at a budget of 256)."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from evaluation.catalogue.budgets import Budget
from evaluation.protocols.traces.policies import recent_h2o, seed_h2o

RECENT, FIRST = 64, 4  # the TOVA seed's claim: the 64 most recent and the 4 first positions stay held
RECENT_HELD, FIRST_HELD = f"recent_{RECENT}_held", f"first_{FIRST}_held"  # per-layer counts on retained_mass rows
RECENT_SHARE = f"recent_{RECENT}_attention_share"  # per layer, on a trace's summary row
TOVA, H2O = "tova", "h2o"


@dataclass(frozen=True)
class TovaClaim:
    """One text at one budget: means over layers (and their KV groups); retained mass also over steps. ``seed``:
    the seed's H2O (summed, its window protected); ``h2o``: the lab's (KVPress's, averaged)."""

    text: str
    budget: str
    recent_share: float  # the share of each step's attention on the RECENT newest positions
    tova_mass: float
    seed_mass: float
    h2o_mass: float
    h2o_window_mass: float | None  # the lab's h2o with the seed's window, when the run had one
    tova_recall: float
    seed_recall: float
    tova_recent: float  # the share of the RECENT newest positions held after the last step
    seed_recent: float
    tova_first: float  # the share of the FIRST positions held after the last step
    seed_first: float


def tova_claims(rows: list[dict], budgets: list[int], window: int) -> list[TovaClaim]:
    """The claims of every trace of ``rows`` (a run's ``predictions.jsonl``, its H2O window ``window``) at every
    budget TOVA, the seed's H2O and ``h2o`` ran at, in the order of the traces' summary rows and of ``budgets``."""
    cells = {(row["trace"], row["press"], row["budget"], row["metric"]): row for row in rows}
    claims = [
        claim(summary, Budget("tokens", b), cells, window)
        for summary in rows
        if summary["metric"] == "summary"
        for b in budgets
    ]
    return [c for c in claims if c is not None]


def claim(summary: dict, budget: Budget, cells: dict, window: int) -> TovaClaim | None:
    """One trace's claim at ``budget`` from its rows ``cells`` (by trace, press, budget key and metric)."""

    def cell(press: str | None, metric: str) -> dict:
        return cells.get((summary["trace"], press, budget.key, metric), {})

    seed = seed_h2o(window)
    tova, summed, h2o = (cell(name, "retained_mass") for name in (TOVA, seed, H2O))
    if not tova or not summed or not h2o:
        return None
    return TovaClaim(
        text=summary["text"],
        budget=budget.label,
        recent_share=fmean(summary[RECENT_SHARE]),
        tova_mass=tova["score"],
        seed_mass=summed["score"],
        h2o_mass=h2o["score"],
        h2o_window_mass=cell(recent_h2o(window), "retained_mass").get("score") if window else None,
        tova_recall=cell(TOVA, "heavy_hitter_recall")["score"],
        seed_recall=cell(seed, "heavy_hitter_recall")["score"],
        tova_recent=fmean(tova[RECENT_HELD]) / RECENT,
        seed_recent=fmean(summed[RECENT_HELD]) / RECENT,
        tova_first=fmean(tova[FIRST_HELD]) / FIRST,
        seed_first=fmean(summed[FIRST_HELD]) / FIRST,
    )


def tova_table(claims: list[TovaClaim], window: int) -> list[str]:
    """The claims as a markdown section (the seed's figures and which H2O is which in its lead)."""
    seed, averaged = seed_h2o(window), recent_h2o(window)
    lines = [
        "",
        "## The TOVA seed's claims",
        "",
        "The seed: TOVA retains more attention mass than H2O at every budget, by around 0.13, where the seed's H2O "
        "sums the attention each position receives and protects a fixed 32 newest positions; H2O wins heavy-hitter "
        f"recall at every budget; the trace puts 0.55 of its attention on the {RECENT} newest positions, and at a "
        f"budget of 256 TOVA still holds all {RECENT} of them and all {FIRST} first positions (the sinks) once the "
        f"trace is read. Here the seed's H2O is `{seed}`: attention summed over every step since a position "
        f"arrived, its {window} newest positions protected; `tova - seed H2O` is the claim's difference, and recall "
        "and the held shares set TOVA against it. For reference, the lab's `h2o` (KVPress's "
        "`ObservedAttentionPress`) averages each position's attention over the steps that saw it, which favours "
        f"recent positions; `{averaged}` is that average with the seed's window. Means over layers; retained mass "
        "over steps too; held: the share of those positions held after the last step.",
        "",
        f"| text | budget | attention on newest {RECENT} | mass tova | mass seed H2O (summed, window {window}) | "
        f"tova - seed H2O | mass h2o (averaged) | mass h2o (averaged, window {window}) | recall tova | "
        f"recall seed H2O | newest {RECENT} held tova | seed H2O | first {FIRST} held tova | seed H2O |",
        "|---|---|" + "---|" * 12,
    ]
    for claim in claims:
        figures = [
            claim.recent_share,
            claim.tova_mass,
            claim.seed_mass,
            claim.tova_mass - claim.seed_mass,
            claim.h2o_mass,
            claim.h2o_window_mass,
            claim.tova_recall,
            claim.seed_recall,
            claim.tova_recent,
            claim.seed_recent,
            claim.tova_first,
            claim.seed_first,
        ]
        texts = ["-" if value is None else f"{value:.3f}" for value in figures]
        lines.append(f"| {claim.text} | {claim.budget} | " + " | ".join(texts) + " |")
    return lines
