"""Append-only, resumable results: one JSON line per finished cell, fsynced as it is written.

A line cut short by a crash is dropped (and the file truncated back to its last complete line) on the next
open, so an interrupted write never corrupts what later runs read; every complete line is kept. A link where the
file belongs is refused before anything is read or cut (``evaluation.runs.files``). A stored row that older code
left without some fields gets them by ``amend``: the whole file written anew, each row on its line, and renamed
over the old one, so a crash leaves one file or the other, never a mix.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Hashable
from pathlib import Path

from evaluation.errors import EvaluationError
from evaluation.runs.files import append_only, naming, refuse_link, write_atomically
from evaluation.runs.json_rows import json_lines, whole_lines

logger = logging.getLogger(__name__)


DAMAGED = "the folder was edited or damaged: remove that line, or the file, to run those cells again"


class ResultStore:
    """The rows of ``path``, indexed by ``key(row)``, with ``append`` for new ones."""

    def __init__(self, path: Path, key: Callable[[dict], Hashable]) -> None:
        self.path, self.key = path, key
        self.on_append: Callable[[dict], None] | None = None  # told of each row appended or completed (a bar)
        self.rows: list[dict] = []
        self.by_key: dict[Hashable, dict] = {}
        refuse_link(path)
        if path.exists():
            self._load()

    def _load(self) -> None:
        complete, torn = whole_lines(self.path.read_bytes())
        if torn:
            logger.warning("%s: dropping an incomplete last line left by an interrupted run", self.path)
            with naming(self.path), append_only(self.path) as handle:
                handle.truncate(len(complete))
        try:
            rows = list(json_lines(complete, self.path))
        except EvaluationError as error:
            raise EvaluationError(f"{error}; {DAMAGED}") from error
        for line_number, row in rows:
            where = f"{self.path}:{line_number}"
            try:
                key = self.key(row)
            except (KeyError, TypeError, AttributeError) as error:
                raise EvaluationError(f"{where}: a JSON line, not a result row (no {error}); {DAMAGED}") from None
            if key in self.by_key:
                raise EvaluationError(f"{where}: a second result for {key}; {DAMAGED}")
            self.rows.append(row)
            self.by_key[key] = row

    def __contains__(self, key: Hashable) -> bool:
        return key in self.by_key

    def get(self, key: Hashable) -> dict | None:
        return self.by_key.get(key)

    def append(self, row: dict) -> None:
        key = self.key(row)
        if key in self.by_key:
            raise ValueError(f"{self.path}: a result for {key} is already stored")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with naming(self.path), append_only(self.path) as handle:
            handle.write((json.dumps(row, ensure_ascii=False) + "\n").encode())
            handle.flush()
            os.fsync(handle.fileno())
        self.rows.append(row)
        self.by_key[key] = row
        if self.on_append is not None:
            self.on_append(row)

    def amend(self, rows: list[dict]) -> None:
        """Replace stored rows by these, each the stored row of its key with fields added (never one changed), and
        rewrite the file at once."""
        if rows:
            self._replace(rows)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in self.rows))
            for row in rows if self.on_append is not None else ():
                self.on_append(row)

    def _replace(self, rows: list[dict]) -> None:
        positions = {id(row): index for index, row in enumerate(self.rows)}
        for row in rows:
            key = self.key(row)
            stored = self.by_key.get(key)
            if stored is None or any(field not in row or row[field] != value for field, value in stored.items()):
                raise ValueError(f"{self.path}: an amended row for {key} must keep every field of the stored one")
            self.rows[positions[id(stored)]] = self.by_key[key] = row
            positions[id(row)] = positions.pop(id(stored))


class MemoryStore(ResultStore):
    """A ``ResultStore`` held in memory: what a remote worker fills for one unit, seeded with the unit's rows
    that the driver already has (so a resumed unit skips them exactly as a local run would)."""

    def __init__(self, key: Callable[[dict], Hashable], rows: list[dict]) -> None:
        self.path, self.key = Path(os.devnull), key
        self.rows, self.by_key = list(rows), {key(row): row for row in rows}
        self.new_rows: list[dict] = []
        self.amended_rows: list[dict] = []

    def append(self, row: dict) -> None:
        key = self.key(row)
        if key in self.by_key:
            raise ValueError(f"a result for {key} is already stored")
        self.rows.append(row)
        self.new_rows.append(row)
        self.by_key[key] = row

    def amend(self, rows: list[dict]) -> None:
        self._replace(rows)
        self.amended_rows += rows
