"""Rows of JSON files, read with ``json`` straight from the file: results (``predictions.jsonl``, one row a line)
and data (LongBench's ``<task>.jsonl``, LoCoMo's ``locomo10.json``, a JSON array of rows).

Every mistake is a one-line ``EvaluationError`` naming the file and the line. Nothing is cached, so an edited
file is read anew whatever its size and time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from evaluation.errors import EvaluationError

UNREADABLE = "not a readable JSON file"
TORN = (
    "is cut short (the last line, with no line end): a write torn by an interrupted run; run the same command "
    "that wrote the file again (a run repairs it and resumes), or delete that line"
)
AN_ARRAY = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*\[")


def whole_lines(data: bytes) -> tuple[bytes, bytes]:
    """``data`` cut after its last line end: its whole lines, and what follows them (the start of a torn write)."""
    end = data.rfind(b"\n") + 1
    return data[:end], data[end:]


def json_lines(data: bytes, path: Path) -> Iterator[tuple[int, dict]]:
    """Each row of ``data``, JSON lines read from ``path``, with its line number: one object a line, blank lines
    skipped; a line that is not UTF-8, not JSON or not an object is an error naming the file and the line, and a
    last line without a line end that is not JSON is explained as the torn write it is."""
    lines = data.splitlines()
    torn = len(lines) if whole_lines(data)[1].strip() else None
    for number, raw in enumerate(lines, start=1):
        if raw.strip():
            try:
                row = parse_json(raw, path, number)
            except EvaluationError:
                if number != torn:
                    raise
                raise EvaluationError(f"{path}: line {number} {TORN}") from None
            if not isinstance(row, dict):
                raise EvaluationError(f"{path}: line {number} is not a JSON object (a row)")
            yield number, row


def parse_json(raw: bytes, path: Path, first_line: int = 1) -> object:
    """The JSON value of ``raw``, which starts at line ``first_line`` of ``path``; bytes that are not UTF-8 or
    not JSON are an error naming the file and the line."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = first_line + raw.count(b"\n", 0, error.start)
        raise EvaluationError(f"{path}: {UNREADABLE} (line {line}: not UTF-8 text, {error.reason})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        line = first_line + error.lineno - 1
        raise EvaluationError(f"{path}: {UNREADABLE} (line {line}, column {error.colno}: {error.msg})") from None


def numbered_rows(path: Path) -> list[tuple[int, dict]]:
    """Every row of ``path`` in file order, as written, with its line number (``json_lines``), or in a JSON array
    of objects its item number."""
    if not path.is_file():
        raise EvaluationError(f"{path} not found")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise EvaluationError(f"{path}: {UNREADABLE} ({error.strerror})") from error
    if not AN_ARRAY.match(data):
        return list(json_lines(data, path))
    rows = parse_json(data, path)
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise EvaluationError(f"{path}: item {number} of the array is not a JSON object (a row)")
    return list(enumerate(rows, start=1))


def read_rows(path: Path) -> list[dict]:
    """Every row of ``path`` in file order, as written (``numbered_rows``)."""
    return [row for _, row in numbered_rows(path)]


def load_json_rows(path: Path) -> list[dict]:
    """A data file's rows in file order (``read_rows``) as a table, as ``datasets``' json builder gave them: a
    key that some rows hold is None in the rows that lack it, keys in the order they first appear. A file that
    holds no row is an error naming it."""
    rows = read_rows(path)
    if not rows:
        raise EvaluationError(f"{path} holds no rows: point the run at a file with examples")
    columns = dict.fromkeys(key for row in rows for key in row)
    return [{key: row.get(key) for key in columns} for row in rows]


def json_kind(value: object) -> str:
    """A JSON value's kind in words, for a message that says what a field holds instead of what it should."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})" if len(value) <= 40 else "a string"
    return "a list" if isinstance(value, list) else "an object"


def text_list_kind(value: object) -> str:
    """What a JSON value that should be a list of strings is instead, in words ("" when it is one): a list by its
    first item that is not a string."""
    if not isinstance(value, list):
        return json_kind(value)
    wrong = [item for item in value if not isinstance(item, str)]
    return f"a list holding {json_kind(wrong[0])}" if wrong else ""
