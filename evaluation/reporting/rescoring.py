"""What ``python -m evaluation score`` needs of a protocol whose predictions it rescores (``Rescoring``), and the
checks of a line that every rescoring shares: each names the file and the line."""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from evaluation.errors import EvaluationError

if TYPE_CHECKING:  # the score command's frame: pandas is not imported to declare a protocol
    import pandas as pd


@dataclass(frozen=True)
class Rescoring:
    """How a protocol's predictions are rescored with its official metric: every line of the file holds
    ``columns`` (the fields ``fields`` names, as the command's help says them); ``group`` reads a line's group (its
    task, its category) once every line is read, ``check`` checks a line of its group once every group is read,
    ``score`` scores it, and ``summary`` turns the frame of every line's ``group`` and ``score`` into the scores
    printed."""

    columns: tuple[str, ...]
    fields: str
    group: Callable[[Path, int, dict], object]
    check: Callable[[Path, int, dict, object], None]
    score: Callable[[Path, int, dict, object], float]
    summary: Callable[[pd.DataFrame], dict]


def is_text(value: object) -> bool:
    return isinstance(value, str)


def is_texts(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def is_answer(value: object) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


TYPES: dict[str, tuple[Callable[[object], bool], str]] = {
    "task": (is_text, "text: a LongBench task's name"),
    "prediction": (is_text, 'text: the model\'s answer ("" for none)'),
    "scored_prediction": (is_text, "text: the answer as the run scored it"),
    "answers": (is_texts, "a list of strings: the gold answers"),
    "all_classes": (lambda value: value is None or is_texts(value), "a list of strings or null"),
    "answer": (is_answer, "a string or a number: the gold answer"),
}


def checked(path: Path, line: int, row: dict, fields: tuple[str, ...]) -> None:
    """Each of ``fields`` is in ``row`` with the type its metric reads (``TYPES``); else an error naming the file,
    the line and the field."""
    if row.get("error") and "prediction" not in row:
        raise EvaluationError(
            f"{path}: line {line} is a failed cell ({row['error']}), with no prediction to score: leave it out (a "
            "run's scorecard counts failed cells)"
        )
    for field in fields:
        if field not in row:
            raise EvaluationError(f"{path}: line {line}: no {field}; give every line the fields {list(fields)}")
        valid, expected = TYPES[field]
        if not valid(row[field]):
            raise EvaluationError(f"{path}: line {line}: {field} {reprlib.repr(row[field])} is not {expected}")


def scored(path: Path, line: int, metric: Callable[..., float], *row: object) -> float:
    """One line's score; a value the metric refuses (an unknown task or category) is an error naming the line."""
    try:
        return metric(*row)
    except (ValueError, KeyError, TypeError) as error:
        raise EvaluationError(f"{path}: line {line}: {str(error).strip(chr(34) + chr(39))}") from None
