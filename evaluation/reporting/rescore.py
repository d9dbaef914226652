"""``python -m evaluation score``: a JSONL file of predictions rescored with the official metrics."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from evaluation.errors import EvaluationError
from evaluation.metrics.locomo import score
from evaluation.metrics.longbench import sample_score, task_score
from evaluation.runs.json_rows import read_rows

COLUMNS = {"longbench": ("task", "prediction", "answers"), "locomo": ("category", "prediction", "answer")}


def rescore(benchmark: str, path: Path, per_row: bool) -> dict:
    """LongBench: the official task score (100 x mean, 2 decimals) per task; LoCoMo: the mean F1 per category
    and overall. ``per_row`` adds every line's score in file order."""
    frame = pd.DataFrame(read_rows(path))
    missing = [column for column in COLUMNS[benchmark] if column not in frame]
    if frame.empty or missing:
        raise EvaluationError(f"{path}: every line needs the fields {list(COLUMNS[benchmark])} (missing {missing})")
    if benchmark == "longbench":
        classes = frame["all_classes"] if "all_classes" in frame else pd.Series([None] * len(frame))
        empty = next((line for line, answers in enumerate(frame["answers"], 1) if not answers), None)
        if empty is not None:
            raise EvaluationError(f"{path}: line {empty}: an empty answers list would score 0; give the gold answers")
        rows = zip(frame["task"], frame["prediction"], frame["answers"], classes, strict=True)
        frame["score"] = [scored(path, line, sample_score, *row) for line, row in enumerate(rows, 1)]
        result = frame.groupby("task", sort=False)["score"].agg(task_score).to_dict()
    else:
        frame["category"] = [category_of(path, line, c) for line, c in enumerate(frame["category"], 1)]
        rows = zip(frame["category"], frame["prediction"], frame["answer"], strict=True)
        frame["score"] = [scored(path, line, score, *row) for line, row in enumerate(rows, 1)]
        result = {str(key): value for key, value in frame.groupby("category")["score"].mean().items()}
        result["overall"] = float(frame["score"].mean())
    if per_row:
        result["rows"] = frame["score"].tolist()
    return result


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
