"""What a protocol tells its scorecard: the conditions a row counts in, what identifies an example, the scale."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Contrast:
    """The paired difference of two conditions of one press at one budget, over matched pairs of examples (a
    reused code against its control): ``pair`` names the pair a row belongs to."""

    minuend: str
    subtrahend: str
    pair: Callable[[dict], tuple]

    @property
    def name(self) -> str:
        return f"{self.minuend} - {self.subtrahend}"


@dataclass(frozen=True)
class Benchmark:
    name: str
    conditions: Callable[[dict], list[str]]  # the conditions a row counts in
    example_id: Callable[[dict], tuple]
    scale: float  # LongBench reports 100 x mean, LoCoMo the mean F1
    digits: int
    order: tuple[str, ...] = ()  # the protocol's own order of its conditions, if it has one
    contrasts: tuple[Contrast, ...] = ()
