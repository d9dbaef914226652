"""Data files read through ``datasets``' json builder (JSON or JSON lines), with one-line errors.

A read touches neither the network (``datasets`` would count the load on its servers) nor ``datasets``' cache: the
builder's arrow files go to a scratch folder removed after the read, so a dry run writes nothing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from evaluation.errors import EvaluationError, first_line


def load_json_rows(path: Path) -> list[dict]:
    """Every row of ``path`` in file order; a file that is not valid UTF-8 JSON, or holds no row, is an error
    that names it."""
    import datasets

    counting, bars = datasets.config.HF_UPDATE_DOWNLOAD_COUNTS, not datasets.utils.are_progress_bars_disabled()
    try:
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
        datasets.disable_progress_bars()  # a scratch cache rebuilds every time: its bar says nothing
        with tempfile.TemporaryDirectory() as scratch:
            rows = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=scratch).to_list()
    except Exception as error:  # datasets wraps the parser's errors (malformed JSON, bad UTF-8) in its own types
        cause = error.__cause__ or error
        reason = first_line(cause)
        raise EvaluationError(f"{path}: not a readable JSON file ({type(cause).__name__}: {reason})") from error
    finally:
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = counting
        if bars:
            datasets.enable_progress_bars()
    if not rows:
        raise EvaluationError(f"{path} holds no rows: point the run at a file with examples")
    return rows
