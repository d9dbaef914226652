"""The TOVA seed's claims, measured on the eviction lab's rows against both H2Os: per text and budget, TOVA's
retained attention mass, heavy-hitter recall and how many of the 64 newest and of the 4 first positions
("attention sinks") it holds once the trace is read (the seed: all of both at a budget of 256), beside the same
for the seed's H2O (attention summed, its 32 newest positions protected: ``SummedH2OPolicy``) and for KVPress's
H2O (``ObservedAttentionPress``, the lab's ``h2o``: attention averaged over the rows that saw a position), with
Belady's heavy-hitter recall beside theirs: the metric rewards agreeing with attention summed in hindsight, not
holding what later steps use."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from evaluation.catalogue.budgets import Budget
from evaluation.protocols.traces.policies import seed_h2o

RECENT, FIRST = 64, 4  # the TOVA seed's claim: the 64 most recent and the 4 first positions stay held
RECENT_HELD, FIRST_HELD = f"recent_{RECENT}_held", f"first_{FIRST}_held"  # per-layer counts on retained_mass rows
RECENT_SHARE = f"recent_{RECENT}_attention_share"  # per layer, on a trace's summary row
TOVA, H2O, BELADY = "tova", "h2o", "belady"
AGAINST = ("seed", "h2o")  # the two H2Os TOVA is set against, as ``TovaClaim``'s field prefixes


@dataclass(frozen=True)
class TovaClaim:
    """One text at one budget: means over layers (and their KV groups); retained mass also over steps. ``seed``:
    the seed's H2O (summed, its window protected); ``h2o``: KVPress's (averaged, the lab's ``h2o``). Held shares:
    of the RECENT newest and of the FIRST positions, after the last step."""

    text: str
    budget: str
    recent_share: float  # the share of each step's attention on the RECENT newest positions
    belady_recall: float
    tova_mass: float
    tova_recall: float
    tova_recent: float
    tova_first: float
    seed_mass: float
    seed_recall: float
    seed_recent: float
    seed_first: float
    h2o_mass: float
    h2o_recall: float
    h2o_recent: float
    h2o_first: float


def tova_claims(rows: list[dict], budgets: list[int], window: int) -> list[TovaClaim]:
    """The claims of every trace of ``rows`` (a run's ``predictions.jsonl``, its H2O window ``window``) at every
    budget TOVA, both H2Os and Belady ran at, in the order of the traces' summary rows and of ``budgets``."""
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

    def cell(press: str, metric: str) -> dict:
        return cells.get((summary["trace"], press, budget.key, metric), {})

    policies = {"tova": TOVA, "seed": seed_h2o(window), "h2o": H2O}
    masses = {name: cell(press, "retained_mass") for name, press in policies.items()}
    recalls = {name: cell(press, "heavy_hitter_recall") for name, press in {**policies, BELADY: BELADY}.items()}
    if not all(masses.values()) or not all(recalls.values()):
        return None
    figures = {}
    for name, mass in masses.items():
        figures[f"{name}_mass"] = mass["score"]
        figures[f"{name}_recall"] = recalls[name]["score"]
        figures[f"{name}_recent"] = fmean(mass[RECENT_HELD]) / RECENT
        figures[f"{name}_first"] = fmean(mass[FIRST_HELD]) / FIRST
    return TovaClaim(
        text=summary["text"],
        budget=budget.label,
        recent_share=fmean(summary[RECENT_SHARE]),
        belady_recall=recalls[BELADY]["score"],
        **figures,
    )


def tova_table(claims: list[TovaClaim], window: int) -> list[str]:
    """The claims as a markdown section: the seed's figures and which H2O is which in its lead, then a table
    against each H2O."""
    seed = seed_h2o(window)
    names = {"seed": f"the seed's H2O, `{seed}`", "h2o": "KVPress's H2O, `h2o`"}
    lines = [
        "",
        "## The TOVA seed's claims",
        "",
        "The seed: TOVA retains more attention mass than H2O at every budget, by around 0.13, where the seed's H2O "
        "sums the attention each position receives and protects a fixed 32 newest positions; H2O wins heavy-hitter "
        f"recall at every budget; the trace puts 0.55 of its attention on the {RECENT} newest positions, and at a "
        f"budget of 256 TOVA still holds all {RECENT} of them and all {FIRST} first positions (the sinks) once the "
        f"trace is read. TOVA is set against two H2Os: the seed's, `{seed}` (attention summed over every step "
        f"since a position arrived, its {window} newest positions protected), and KVPress's, `h2o` "
        "(`ObservedAttentionPress`: each position's attention averaged over the steps that saw it, which favours "
        "recent positions), the H2O every other protocol runs. Heavy-hitter recall is the share of the budget's "
        "positions with the most attention summed over the whole trace that a policy holds at the end: agreement "
        "with summed attention in hindsight, the seed's H2O's own ranking, not a measure of holding what later "
        "steps use; Belady, the offline optimum of hit rate (it evicts the position whose next use is farthest), is "
        "printed beside it: where it scores below a policy, the lead says nothing about keeping what the model "
        "needs. Means over layers; retained mass over steps too; held: the share of those positions held after the "
        "last step.",
    ]
    for against in AGAINST:
        lines += [
            "",
            f"Against {names[against]}:",
            "",
            f"| text | budget | attention on newest {RECENT} | mass tova | mass H2O | tova - H2O | recall tova | "
            f"recall H2O | recall belady | newest {RECENT} held tova | H2O | first {FIRST} held tova | H2O |",
            "|---|---|" + "---|" * 11,
        ]
        for claim in claims:
            tova, h2o = claim.tova_mass, getattr(claim, f"{against}_mass")
            figures = [claim.recent_share, tova, h2o, tova - h2o, claim.tova_recall]
            figures += [getattr(claim, f"{against}_recall"), claim.belady_recall]
            figures += [claim.tova_recent, getattr(claim, f"{against}_recent")]
            figures += [claim.tova_first, getattr(claim, f"{against}_first")]
            texts = [f"{v:+.3f}" if i == 3 else f"{v:.3f}" for i, v in enumerate(figures)]  # 3: the difference
            lines.append(f"| {claim.text} | {claim.budget} | " + " | ".join(texts) + " |")
    return lines
