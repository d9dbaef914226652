"""``python -m evaluation score``: a JSONL file of predictions rescored with the official metrics."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from evaluation.errors import EvaluationError
from evaluation.store import read_rows

COLUMNS = {"longbench": ("task", "prediction", "answers"), "locomo": ("category", "prediction", "answer")}


def rescore(benchmark: str, path: Path, per_row: bool) -> dict:
    """LongBench: the official task score (100 x mean, 2 decimals) per task; LoCoMo: the mean F1 per category
    and overall. ``per_row`` adds every line's score in file order."""
    from evaluation.metrics.locomo import score
    from evaluation.metrics.longbench import sample_score, task_score

    frame = pd.DataFrame(read_rows(path))
    missing = [column for column in COLUMNS[benchmark] if column not in frame]
    if frame.empty or missing:
        raise EvaluationError(f"{path}: every line needs the fields {list(COLUMNS[benchmark])} (missing {missing})")
    if benchmark == "longbench":
        classes = frame["all_classes"] if "all_classes" in frame else pd.Series([None] * len(frame))
        frame["score"] = [
            sample_score(task, prediction, answers, all_classes)
            for task, prediction, answers, all_classes in zip(
                frame["task"], frame["prediction"], frame["answers"], classes, strict=True
            )
        ]
        result = frame.groupby("task", sort=False)["score"].agg(task_score).to_dict()
    else:
        frame["category"] = frame["category"].astype(int)
        frame["score"] = [
            score(category, prediction, answer)
            for category, prediction, answer in zip(
                frame["category"], frame["prediction"], frame["answer"], strict=True
            )
        ]
        result = {str(key): value for key, value in frame.groupby("category")["score"].mean().items()}
        result["overall"] = float(frame["score"].mean())
    if per_row:
        result["rows"] = frame["score"].tolist()
    return result
