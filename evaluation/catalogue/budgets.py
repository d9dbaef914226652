"""Compression budgets: a ratio of the cache to evict, or an absolute number of tokens to keep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from evaluation.catalogue.specs import FULL_CACHE
from evaluation.errors import EvaluationError

if TYPE_CHECKING:  # resolved presses import KVPress, which the command line does not load to start
    from evaluation.catalogue.resolved import ResolvedPress


@dataclass(frozen=True)
class Budget:
    kind: str  # "ratio" (fraction evicted) or "tokens" (tokens kept)
    value: float

    def __post_init__(self) -> None:
        if self.kind == "ratio" and not 0 <= self.value < 1:
            raise EvaluationError(f"compression ratio {self.value} is outside [0, 1): it is the fraction evicted")
        if self.kind == "tokens" and (self.value <= 0 or self.value != int(self.value)):
            raise EvaluationError(f"token budget {self.value} must be a whole number of tokens > 0")
        if self.kind not in ("ratio", "tokens"):
            raise ValueError(f"unknown budget kind {self.kind!r}")

    @property
    def key(self) -> str:
        return f"ratio={self.value:g}" if self.kind == "ratio" else f"tokens={int(self.value)}"

    @property
    def label(self) -> str:
        return f"keep {100 * (1 - self.value):.0f}%" if self.kind == "ratio" else f"{int(self.value)} tokens"

    def compression_ratio(self, length: int) -> float:
        """The ratio that keeps this budget of a ``length``-token cache (0 when it already fits).

        For a token budget B < length, ``int(length * (1 - ratio))`` is exactly B.
        """
        if self.kind == "ratio":
            return self.value
        return max(0.0, 1 - (self.value + 0.5) / length) if self.value < length else 0.0


def parse_budgets(ratios: list[float] | None, tokens: list[int] | None) -> list[Budget]:
    """The budgets asked for, each once, in the order given."""
    budgets = [Budget("ratio", r) for r in ratios or []] + [Budget("tokens", t) for t in tokens or []]
    return list(dict.fromkeys(budgets))


def budget_of(key: str) -> Budget:
    """The budget of its ``key`` (``ratio=0.5``, ``tokens=512``), as run.json records a run's budgets."""
    kind, _, value = key.partition("=")
    try:
        return Budget(kind, float(value))
    except ValueError:
        raise EvaluationError(f"{key!r} is no budget key (ratio=R or tokens=N)") from None


def budget_key(budget: Budget | None) -> str:
    """The resume key of a cell's budget; the full-cache cell (no budget) is ``"full"``."""
    return budget.key if budget else FULL_CACHE


def budget_label(budget: Budget | None, length: int | None = None) -> str:
    """A budget's name in tables; a token budget at or above the ``length`` of a row's context compresses nothing,
    and says so."""
    if budget is not None and budget.kind == "tokens" and length is not None and budget.value >= length:
        return budget.label + OVER_THE_CONTEXT
    return budget.label if budget else FULL_CACHE


OVER_THE_CONTEXT = " (>= the context: the full cache)"


def ratio_for(budget: Budget | None, length: int) -> float:
    """The compression ratio of a cell over a ``length``-token cache (0 for the full cache)."""
    return budget.compression_ratio(length) if budget else 0.0


@dataclass(frozen=True)
class Cell:
    """One press at one budget (None: the full cache). The press is resolved (``catalogue.resolved``): a cell
    carries it, so that the process that serves the cell, a Ray worker's too, builds it without resolving its spec
    again."""

    press: ResolvedPress
    budget: Budget | None

    @property
    def label(self) -> str:
        """The press's label: its name in the cell's rows."""
        return self.press.label

    @property
    def budget_key(self) -> str:
        return budget_key(self.budget)


def press_cells(presses: list[ResolvedPress], budgets: list[Budget], budget_options: str) -> list[Cell]:
    """The full cache once (if asked for), then every other press at every budget, each cell once.

    Raises
    ------
    EvaluationError
        One line, for no budget, or a press that cannot keep a cell's token budget at all (a ratio budget depends
        on each context's length: such a cell is recorded as failed).
    """
    presses, budgets = list({press.label: press for press in presses}.values()), list(dict.fromkeys(budgets))
    if not budgets and any(press.label != FULL_CACHE for press in presses):
        raise EvaluationError(f"no budget: give at least one {budget_options} value")
    for press in presses:
        for budget in budgets:
            reason = press.budget_refusal(int(budget.value)) if budget.kind == "tokens" else ""
            if reason:
                raise EvaluationError(f"press spec {press.label!r} at a budget of {budget.label}: {reason}")
    full = [Cell(press, None) for press in presses if press.label == FULL_CACHE]
    return full + [Cell(press, budget) for press in presses if press.label != FULL_CACHE for budget in budgets]
