"""What a press reads of a prefill, and so how the evaluation engine serves it: its classes' declarations
(``evaluation.catalogue.registry``) combined over every press a wrapper holds, which read the union of what their
presses read; and the newest positions it never evicts, which a budget must hold (``budget_refusal``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvpress.presses.base_press import BasePress

from evaluation.catalogue.registry import ALL, DECODING, OWN_PREFILL, REFUSED, SHARED, after_eviction, declared
from presses.harness import H2O_SUMS, ColumnSums, every_press, protected_refusal


@dataclass(frozen=True)
class Needs:
    path: str
    rows: int | None  # newest rows of each layer's input it reads; None: every row
    sums: frozenset[ColumnSums] = frozenset()
    reads_weights: bool = False  # it reads the attention weights: eager in a prefill of its own; in the engine,
    # H2O's sums as a one-row stand-in for them
    refusal: str = ""  # why it cannot run at all (path REFUSED)


NOTHING = Needs(SHARED, rows=0)  # what the full cache reads: nothing the history does not keep


def needs(press: BasePress) -> Needs:
    """What ``press`` (a wrapper with every press it holds) reads of a prefill, and its path."""
    presses = every_press(press)
    own = [declared(p) for p in presses]
    paths = {d.path for d in own}
    path = DECODING if DECODING in paths else OWN_PREFILL if OWN_PREFILL in paths else SHARED
    rows = [d.rows(p) if callable(d.rows) else d.rows for p, d in zip(presses, own, strict=True)]
    late = [declared(p) for p in after_eviction(press)]
    if any(d.rescores for d in late):
        rows.append(ALL)  # after another press evicted, ours score the prompt's keys, recomputed from every row
    refusals = [d.refusal for d in own if d.path == REFUSED]
    if any(d.weights for d in late):
        refusals.append(
            "ObservedAttentionPress after a press that evicts sums attention over keys "
            "that press removed (KVPress's ComposedPress documents it fails): put it first"
        )
    if refusals:
        return Needs(REFUSED, ALL, refusal=refusals[0])
    sums = [d.sums(p) if d.sums else frozenset() for p, d in zip(presses, own, strict=True)]
    readers = [i for i, d in enumerate(own) if d.weights]
    stand_in = all(H2O_SUMS in sums[i] for i in readers) and all(d.blind or d.weights for d in own)
    if readers and not stand_in:
        path = OWN_PREFILL if path == SHARED else path  # an eager prefill: beside attention rows, or a subclass
    return Needs(path=path, rows=combined(rows), sums=frozenset().union(*sums), reads_weights=bool(readers))


def combined(rows: list[int | None]) -> int | None:
    """The rows to keep for presses that read these: every row if one reads them all, else the most any reads."""
    return ALL if ALL in rows else max(rows, default=0)


@dataclass(frozen=True)
class Protected:
    """The ``count`` newest positions a press never evicts, set by its ``parameter`` (``RMMPress``'s commit lag,
    ``RecentWindowPress``'s window)."""

    press: str
    parameter: str
    count: int


def protected(press: BasePress | None) -> tuple[Protected, ...]:
    """The newest positions each press ``press`` holds never evicts, as their classes declare them."""
    found = []
    for held in every_press(press) if press is not None else []:
        parameter = declared(held).protects
        if parameter and getattr(held, parameter) is not None:
            found.append(Protected(type(held).__name__, parameter, getattr(held, parameter)))
    return tuple(found)


def budget_refusal(positions: Iterable[Protected], kept: int) -> str:
    """Why a press that never evicts these ``positions`` cannot keep ``kept`` positions at all ("" when it can): the
    budget must hold them and one slot more."""
    refusals = (protected_refusal(held.press, held.parameter, held.count, kept) for held in positions)
    return next(filter(None, refusals), "")
