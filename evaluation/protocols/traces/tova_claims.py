"""The TOVA seed's claims, measured on the eviction lab's rows: per text and budget, TOVA's retained attention mass
against H2O's (with and without H2O's 32-position recent window), the heavy-hitter recall H2O wins instead, and
how many of the 64 newest and of the 4 first positions ("attention sinks") each holds once the trace is read
(the seed: all of both under TOVA at a budget of 256)."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from evaluation.catalogue.budgets import Budget

RECENT, FIRST = 64, 4  # the TOVA seed's claim: the 64 most recent and the 4 first positions stay held
RECENT_HELD, FIRST_HELD = f"recent_{RECENT}_held", f"first_{FIRST}_held"  # per-layer counts on retained_mass rows
RECENT_SHARE = f"recent_{RECENT}_attention_share"  # per layer, on a trace's summary row
TOVA, H2O = "tova", "h2o"


@dataclass(frozen=True)
class TovaClaim:
    """One text at one budget: means over layers (and their KV groups); retained mass also over steps."""

    text: str
    budget: str
    recent_share: float  # the share of each step's attention on the RECENT newest positions
    tova_mass: float
    h2o_mass: float
    h2o_window_mass: float | None  # H2O with its recent window, when the run had one
    tova_recall: float
    h2o_recall: float
    tova_recent: float  # the share of the RECENT newest positions held after the last step
    h2o_recent: float
    tova_first: float  # the share of the FIRST positions held after the last step
    h2o_first: float


def tova_claims(rows: list[dict], budgets: list[int], h2o_window_policy: str | None) -> list[TovaClaim]:
    """The claims of every trace of ``rows`` (a run's ``predictions.jsonl``) at every budget both TOVA and H2O
    ran at, in the order of the traces' summary rows and of ``budgets``."""
    cells = {(row["trace"], row["press"], row["budget"], row["metric"]): row for row in rows}
    claims = [
        claim(summary, Budget("tokens", b), cells, h2o_window_policy)
        for summary in rows
        if summary["metric"] == "summary"
        for b in budgets
    ]
    return [c for c in claims if c is not None]


def claim(summary: dict, budget: Budget, cells: dict, h2o_window_policy: str | None) -> TovaClaim | None:
    """One trace's claim at ``budget`` from its rows ``cells`` (by trace, press, budget key and metric)."""

    def cell(press: str | None, metric: str) -> dict:
        return cells.get((summary["trace"], press, budget.key, metric), {})

    tova, h2o = cell(TOVA, "retained_mass"), cell(H2O, "retained_mass")
    if not tova or not h2o:
        return None
    return TovaClaim(
        text=summary["text"],
        budget=budget.label,
        recent_share=fmean(summary[RECENT_SHARE]),
        tova_mass=tova["score"],
        h2o_mass=h2o["score"],
        h2o_window_mass=cell(h2o_window_policy, "retained_mass").get("score"),
        tova_recall=cell(TOVA, "heavy_hitter_recall")["score"],
        h2o_recall=cell(H2O, "heavy_hitter_recall")["score"],
        tova_recent=fmean(tova[RECENT_HELD]) / RECENT,
        h2o_recent=fmean(h2o[RECENT_HELD]) / RECENT,
        tova_first=fmean(tova[FIRST_HELD]) / FIRST,
        h2o_first=fmean(h2o[FIRST_HELD]) / FIRST,
    )


def tova_table(claims: list[TovaClaim], h2o_window_policy: str | None) -> list[str]:
    """The claims as a markdown section (the seed's figures in its lead)."""
    window = h2o_window_policy or "h2o with a recent window"
    lines = [
        "",
        "## The TOVA seed's claims",
        "",
        f"The seed: TOVA retains more attention mass than H2O at every budget, by around 0.13 against H2O with a "
        f"fixed 32-position recent window (here `{window}`); H2O wins heavy-hitter recall at every budget; the trace "
        f"puts 0.55 of its attention on the {RECENT} newest positions, and at a budget of 256 TOVA still holds all "
        f"{RECENT} of them and all {FIRST} first positions (the sinks) once the trace is read. Means over layers; "
        "retained mass over steps too; held: the share of those positions held after the last step.",
        "",
        f"| text | budget | attention on newest {RECENT} | mass tova | mass h2o | mass {window} | tova - h2o | "
        f"recall tova | recall h2o | newest {RECENT} held tova | h2o | first {FIRST} held tova | h2o |",
        "|---|---|" + "---|" * 11,
    ]
    for claim in claims:
        figures = [
            claim.recent_share,
            claim.tova_mass,
            claim.h2o_mass,
            claim.h2o_window_mass,
            claim.tova_mass - claim.h2o_mass,
            claim.tova_recall,
            claim.h2o_recall,
            claim.tova_recent,
            claim.h2o_recent,
            claim.tova_first,
            claim.h2o_first,
        ]
        texts = ["-" if value is None else f"{value:.3f}" for value in figures]
        lines.append(f"| {claim.text} | {claim.budget} | " + " | ".join(texts) + " |")
    return lines
