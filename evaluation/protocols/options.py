"""Option types shared by every subcommand: each checks its range as the command line is parsed."""

from __future__ import annotations

import argparse
from collections.abc import Callable

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
