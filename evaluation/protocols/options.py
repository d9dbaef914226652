"""Option types shared by every subcommand, each checking its range as the command line is parsed, and the budget
settings several protocols share."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from evaluation.catalogue.budgets import Budget, budget_of, parse_budgets
from evaluation.settings import Argument, Option, declared, setting

MAX_TOKENS = 1 << 20  # the most tokens a length (a prompt, a history, a text streamed) may ask for
MAX_NEW_TOKENS = 1 << 16  # the most tokens an answer may be given
MAX_RESAMPLES = 100_000  # bootstrap resamples: each interval holds this many means per cell
MAX_GENERATED = 1_000  # episodes, probes or examples a run generates per setting: all are held from its plan on


def whole(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """A whole number from ``minimum`` to ``maximum`` (None: no bound), checked as the command line is parsed."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{value} is above {maximum}, the most this option takes")
        return value

    return parse


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value} is outside [0, 1): it is the fraction of the cache evicted")
    return value


def probability(text: str) -> float:
    value = fraction(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 is outside (0, 1)")
    return value


DEFAULT_RATIOS = [0.5, 0.75]  # the fractions evicted where neither --ratios nor --budgets is given
PATHS = ("shared", "per-cell")  # how a single-turn cell is served: --path


def recorded_budget(recorded: str | dict) -> Budget:
    """A budget as run.json records it: by its key (``ratio=0.5``, ``tokens=512``) or, in an older record, as its
    fields."""
    return Budget(**recorded) if isinstance(recorded, dict) else budget_of(recorded)


def ratios_or_tokens(args: argparse.Namespace) -> list[Budget]:
    ratios = DEFAULT_RATIOS if args.ratios is None and args.budgets is None else args.ratios
    return parse_budgets(ratios, args.budgets)


def ratio_and_token_options(recorded: list) -> dict:
    budgets = [recorded_budget(budget) for budget in recorded]
    ratios = [budget.value for budget in budgets if budget.kind == "ratio"]
    return {"ratios": ratios, "budgets": [int(budget.value) for budget in budgets if budget.kind == "tokens"]}


def ratio_or_token_budgets() -> Any:
    """The budgets of a single-turn protocol: ``--ratios`` (fractions evicted, by default ``DEFAULT_RATIOS`` where
    neither is given) and ``--budgets`` (tokens kept)."""
    ratios = Argument(
        "--ratios", {"nargs": "*", "type": fraction, "help": f"fractions evicted (default {DEFAULT_RATIOS})"}
    )
    tokens = Argument("--budgets", {"nargs": "*", "type": whole(1), "help": "context tokens kept"})
    return declared(Option((ratios, tokens), ratios_or_tokens, ratio_and_token_options))


def token_budgets(**arguments: Any) -> Any:
    """Budgets in tokens kept, ``--budgets`` (``arguments`` as ``add_argument`` takes them)."""
    return setting(
        "--budgets",
        read=lambda args: parse_budgets(None, args.budgets),
        written=lambda recorded: {"budgets": [int(recorded_budget(budget).value) for budget in recorded]},
        nargs="+",
        type=whole(1),
        **arguments,
    )
