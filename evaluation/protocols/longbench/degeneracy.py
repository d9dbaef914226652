"""When LongBench's metric cannot discriminate: the share of a cell's generations that ran to the generation cap
(the task's official length, or ``--max-new-tokens`` below it), and the share that repeat themselves (a sentence
three or more times), per task, budget and press."""

from __future__ import annotations

import re
from collections import Counter

REPEATS = 3  # a generation that says one sentence this many times repeats itself


def repeats_itself(text: str, times: int = REPEATS) -> bool:
    """Whether one sentence (split at . ! ? or a line break, compared without case or surrounding space) occurs
    ``times`` times or more."""
    sentences = [s.strip().lower() for s in re.split(r"[.!?\n]+", text)]
    counts = Counter(s for s in sentences if s)
    return bool(counts) and max(counts.values()) >= times


def degeneracy_lines(rows: list[dict], caps: dict[str, int]) -> list[str]:
    """The scorecard section: per (task, budget, press) in row order, n, the share at the cap, the share that
    repeats itself."""
    cells: dict[tuple[str, str, str], list[dict]] = {}
    for row in rows:
        if not row.get("error") and row["task"] in caps:
            cells.setdefault((row["task"], row["budget_label"], row["press"]), []).append(row)
    if not cells:
        return []
    lines = [
        "",
        "## Generations at the cap and repeating themselves",
        "",
        "A generation that runs to its token cap (the task's official length, or --max-new-tokens below it), or "
        "says one sentence three or more times, leaves the metric little to discriminate (multi_news: ROUGE-L over "
        "long repetitive summaries).",
        "",
        "| task | budget | press | n | at the cap | repeat themselves |",
        "|---|---|---|---|---|---|",
    ]
    for (task, budget, press), chosen in cells.items():
        capped = sum(row["generated_tokens"] >= caps[task] for row in chosen) / len(chosen)
        repeated = sum(repeats_itself(row["prediction"]) for row in chosen) / len(chosen)
        lines.append(f"| {task} | {budget} | {press} | {len(chosen)} | {capped:.0%} | {repeated:.0%} |")
    return lines
