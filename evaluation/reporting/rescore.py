"""``python -m evaluation score``: a JSONL file of predictions rescored with the official metrics."""

from __future__ import annotations

import argparse
import json
import reprlib
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from evaluation.errors import EvaluationError
from evaluation.metrics.locomo import score
from evaluation.metrics.longbench import sample_score, task_score
from evaluation.runs.json_rows import numbered_rows

COLUMNS = {"longbench": ("task", "prediction", "answers"), "locomo": ("category", "prediction", "answer")}
ABSTENTION = 5  # LoCoMo's adversarial category: scored on the prediction alone, with no gold answer


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


def rescore(benchmark: str, path: Path, per_row: bool) -> dict:
    """LongBench: the official task score (100 x mean, 2 decimals) per task; LoCoMo: the mean F1 per category
    and overall, of each line's ``scored_prediction`` where a run wrote one (an adversarial letter answer as its
    option's text, which only the run's rendered options tell), else its ``prediction``. ``per_row`` adds every
    line's score in file order."""
    numbered = numbered_rows(path)
    missing = [column for column in COLUMNS[benchmark] if not any(column in row for _, row in numbered)]
    if not numbered or missing:
        raise EvaluationError(f"{path}: every line needs the fields {list(COLUMNS[benchmark])} (missing {missing})")
    if benchmark == "longbench":
        for line, row in numbered:
            checked(path, line, row, (*COLUMNS[benchmark], *(["all_classes"] if "all_classes" in row else [])))
            if not row["answers"]:
                raise EvaluationError(
                    f"{path}: line {line}: an empty answers list would score 0; give the gold answers"
                )
        frame = pd.DataFrame({"task": [row["task"] for _, row in numbered]})
        frame["score"] = [
            scored(path, line, sample_score, row["task"], row["prediction"], row["answers"], row.get("all_classes"))
            for line, row in numbered
        ]
        result = frame.groupby("task", sort=False)["score"].agg(task_score).to_dict()
    else:
        frame = pd.DataFrame({"category": [category_of(path, line, row.get("category")) for line, row in numbered]})
        for (line, row), category in zip(numbered, frame["category"], strict=True):
            given = (*(["scored_prediction"] if "scored_prediction" in row else []), "prediction")
            checked(path, line, row, given if category == ABSTENTION else (*given, "answer"))
        frame["score"] = [
            scored(path, line, score, category, row.get("scored_prediction", row["prediction"]), row.get("answer"))
            for (line, row), category in zip(numbered, frame["category"], strict=True)
        ]
        result = {str(key): value for key, value in frame.groupby("category")["score"].mean().items()}
        result["overall"] = float(frame["score"].mean())
    if per_row:
        result["rows"] = frame["score"].tolist()
    return result


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


def category_of(path: Path, line: int, category: object) -> int:
    try:
        return int(category)
    except (TypeError, ValueError):
        raise EvaluationError(f"{path}: line {line}: category {category!r} is not LoCoMo's 1 to 5") from None


def command(args: argparse.Namespace) -> int:
    """``python -m evaluation score``."""
    print(json.dumps(rescore(args.benchmark, args.file, args.per_row)))
    return 0
