"""The settings every single-turn protocol of KVPress-format examples shares (RULER, needle-in-a-haystack,
KVPress's datasets)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from evaluation.catalogue.budgets import Budget, budget_of, parse_budgets
from evaluation.protocols.options import fraction, whole
from evaluation.protocols.protocol import DEFINING, MODEL_DEFINING
from evaluation.runs.models import ModelSettings

PATHS = ("shared", "per-cell")
DEFAULT_RATIOS = [0.5, 0.75]


@dataclass
class SingleTurnConfig:
    model: ModelSettings = field(metadata=MODEL_DEFINING)
    presses: list[str]
    budgets: list[Budget]
    output: Path
    query_aware: bool = field(default=False, metadata=DEFINING)
    likelihood_only: bool = field(default=False, metadata=DEFINING)  # the answer's likelihood alone, no generation
    path: str = "shared"
    allow_import: bool = False  # import the press specs' import paths (--allow-import)

    def generation_cap(self, official: int) -> int:
        """How many tokens a cell generates: the task's ``official`` length, none for ``likelihood_only``."""
        return 0 if self.likelihood_only else official


def add_budget_options(parser: argparse.ArgumentParser) -> None:
    """The options every single-turn protocol of KVPress-format examples shares: budgets, query, likelihood, path."""
    parser.add_argument("--ratios", nargs="*", type=fraction, help=f"fractions evicted (default {DEFAULT_RATIOS})")
    parser.add_argument("--budgets", nargs="*", type=whole(1), help="context tokens kept")
    parser.add_argument("--query-aware", action="store_true", help="compress the question with the context")
    parser.add_argument(
        "--likelihood-only",
        action="store_true",
        help="score only the gold answer's likelihood under each cache, no generation (a run of its own)",
    )
    parser.add_argument(
        "--path",
        choices=list(PATHS),
        default="shared",
        help="shared (default): one full-cache prefill per example serves every press it can; per-cell: KVPress's "
        "prefill under the press once per cell",
    )


def budget_settings(args: argparse.Namespace, model: ModelSettings, output: Path) -> dict:
    ratios = DEFAULT_RATIOS if args.ratios is None and args.budgets is None else args.ratios
    return {
        "model": model,
        "presses": args.presses,
        "budgets": parse_budgets(ratios, args.budgets),
        "output": output,
        "query_aware": args.query_aware,
        "likelihood_only": args.likelihood_only,
        "path": args.path,
        "allow_import": args.allow_import,
    }


def recorded_options(settings: dict) -> dict:
    """The option values of a recorded run's settings (its budgets recorded by key)."""
    budgets = [budget_of(key) for key in settings.get("budgets", [])]
    ratios = [budget.value for budget in budgets if budget.kind == "ratio"]
    tokens = [int(budget.value) for budget in budgets if budget.kind == "tokens"]
    return {**settings, "ratios": ratios, "budgets": tokens}
