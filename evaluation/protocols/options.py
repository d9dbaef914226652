"""Option types shared by every subcommand: each checks its range as the command line is parsed."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
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
