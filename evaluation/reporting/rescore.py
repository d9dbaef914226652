"""``python -m evaluation score``: a JSONL file of predictions rescored with the official metric of the protocol
named, as its ``Rescoring`` says."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from evaluation.errors import EvaluationError
from evaluation.reporting.rescoring import Rescoring
from evaluation.runs.json_rows import numbered_rows


def rescore(rescoring: Rescoring, path: Path, per_row: bool) -> dict:
    """Every line of ``path`` checked and scored by ``rescoring``, and its summary; ``per_row`` adds every line's
    score in file order."""
    numbered = numbered_rows(path)
    missing = [column for column in rescoring.columns if not any(column in row for _, row in numbered)]
    if not numbered or missing:
        raise EvaluationError(f"{path}: every line needs the fields {list(rescoring.columns)} (missing {missing})")
    frame = pd.DataFrame({"group": [rescoring.group(path, line, row) for line, row in numbered]})
    for (line, row), group in zip(numbered, frame["group"], strict=True):
        rescoring.check(path, line, row, group)
    frame["score"] = [
        rescoring.score(path, line, row, group) for (line, row), group in zip(numbered, frame["group"], strict=True)
    ]
    result = rescoring.summary(frame)
    if per_row:
        result["rows"] = frame["score"].tolist()
    return result


def command(args: argparse.Namespace) -> int:
    """``python -m evaluation score``; ``args.rescorings``: every protocol's that rescores, by name."""
    print(json.dumps(rescore(args.rescorings[args.benchmark], args.file, args.per_row)))
    return 0
