"""Data files read through ``datasets``' json builder (JSON or JSON lines), with one-line errors."""

from __future__ import annotations

from pathlib import Path

from evaluation.errors import EvaluationError


def load_json_rows(path: Path) -> list[dict]:
    """Every row of ``path`` in file order; a file that is not valid UTF-8 JSON, or holds no row, is an error
    that names it."""
    import datasets

    try:
        rows = datasets.load_dataset("json", data_files=str(path), split="train").to_list()
    except Exception as error:  # datasets wraps the parser's errors (malformed JSON, bad UTF-8) in its own types
        cause = error.__cause__ or error
        reason = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise EvaluationError(f"{path}: not a readable JSON file ({type(cause).__name__}: {reason})") from error
    if not rows:
        raise EvaluationError(f"{path} holds no rows: point the run at a file with examples")
    return rows
