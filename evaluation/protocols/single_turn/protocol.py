"""What a single-turn protocol of KVPress-format examples declares: its shared options (budgets, query, likelihood,
path), how they configure a run and are read back from a run's record, and its rows' key."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TypeVar

from evaluation.catalogue.budgets import budget_of, parse_budgets
from evaluation.catalogue.specs import DEFAULT_PRESSES
from evaluation.protocols.options import fraction, whole
from evaluation.protocols.protocol import LIKELIHOOD, Protocol, Row
from evaluation.protocols.single_turn.config import DEFAULT_RATIOS, PATHS, SingleTurnConfig
from evaluation.runs.models import ModelSettings


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


C = TypeVar("C", bound=SingleTurnConfig)


class SingleTurnProtocol(Protocol[C]):
    """A single-turn protocol of KVPress-format examples: its rows are keyed by example, press and budget, hold the
    gold answer's likelihood, and its recorded budgets are read back by key."""

    likelihood = LIKELIHOOD
    presses = DEFAULT_PRESSES

    def options_of(self, settings: dict) -> dict:
        return recorded_options(settings)

    def row_key(self, row: Row) -> tuple[str, str, str, str]:
        return row["task"], row["id"], row["press"], row["budget"]  # type: ignore[typeddict-item]
