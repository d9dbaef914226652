"""One example in the columns of KVPress's evaluation datasets (context, question, answer_prefix, answer, task,
max_new_tokens), read from a parquet or JSONL file and written back as parquet, so that KVPress's own
``evaluate.py`` runs the examples this harness generates."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

from evaluation.errors import EvaluationError
from evaluation.runs.files import write_atomically

COLUMNS = ("context", "question", "answer_prefix", "answer", "task", "max_new_tokens")
TEXT_COLUMNS = ("context", "question", "answer_prefix", "task")


@dataclass(frozen=True)
class KVPressExample:
    """One example: ``context`` is what the press compresses, ``question`` follows it uncompressed (query-agnostic,
    as in KVPress's pipeline), ``answer_prefix`` opens the model's answer; ``answers`` are the gold answers (RULER's
    ``outputs``), ``max_new_tokens`` the task's generation length. ``length`` and ``depth`` are a generated example's
    target length in tokens and its (first) needle's relative position in the context, 0 to 1, where it has one."""

    id: str
    task: str
    context: str
    question: str
    answer_prefix: str
    answers: tuple[str, ...]
    max_new_tokens: int
    length: int | None = None
    depth: float | None = None

    def columns(self) -> dict:
        """The example as a row of KVPress's columns (``answer`` a list of strings), then ``id``, ``length`` and
        ``depth``."""
        return {
            "context": self.context,
            "question": self.question,
            "answer_prefix": self.answer_prefix,
            "answer": list(self.answers),
            "task": self.task,
            "max_new_tokens": self.max_new_tokens,
            "id": self.id,
            "length": self.length,
            "depth": self.depth,
        }


def export_parquet(examples: list[KVPressExample], path: Path) -> None:
    """``examples`` as a parquet file in KVPress's columns, in order, written whole beside ``path`` and renamed over
    it (``write_atomically``: never through a link)."""
    import pandas as pd

    data = io.BytesIO()
    pd.DataFrame([example.columns() for example in examples]).to_parquet(data, index=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data.getvalue())


def read_examples(path: Path) -> list[KVPressExample]:
    """The rows of a parquet or JSONL file in KVPress's columns, in order; a missing column or a value of the wrong
    kind is one line naming the file."""
    import pandas as pd

    if not path.is_file():
        raise EvaluationError(f"{path} not found: pass --data a parquet or JSONL file in KVPress's columns")
    try:
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_json(path, lines=True, dtype=False)
    except UnicodeDecodeError as error:
        raise EvaluationError(f"{path}: not UTF-8 (byte {error.start}): save it as UTF-8") from None
    except Exception as error:
        raise EvaluationError(f"{path}: not a readable parquet or JSONL file ({type(error).__name__})") from None
    missing = [column for column in COLUMNS if column not in frame.columns]
    if missing:
        raise EvaluationError(f"{path} lacks KVPress's column(s) {missing}: a dataset needs {', '.join(COLUMNS)}")
    return [example_of(row, number, path) for number, row in enumerate(frame.to_dict("records"), start=1)]


def example_of(row: dict, number: int, path: Path) -> KVPressExample:
    """Row ``number`` of ``path`` as an example; its ``answer`` a string or a list of strings; ``id``, ``length``
    and ``depth`` where the file has them (an export of this harness)."""
    for column in TEXT_COLUMNS:
        if not isinstance(row[column], str):
            raise EvaluationError(f"{path}: row {number}: {column} must be a string")
    answer = row["answer"]
    answers = (answer,) if isinstance(answer, str) else tuple(answer) if hasattr(answer, "__iter__") else ()
    if not answers or not all(isinstance(item, str) for item in answers):
        raise EvaluationError(f"{path}: row {number}: answer must be a string or a list of strings")
    tokens = row["max_new_tokens"]
    if isinstance(tokens, bool) or not float(tokens).is_integer() or int(tokens) < 1:
        raise EvaluationError(f"{path}: row {number}: max_new_tokens must be a whole number >= 1")
    identifier, length, depth = row.get("id"), row.get("length"), row.get("depth")
    return KVPressExample(
        id=str(identifier) if isinstance(identifier, str) else str(number - 1),
        task=row["task"],
        context=row["context"],
        question=row["question"],
        answer_prefix=row["answer_prefix"],
        answers=answers,
        max_new_tokens=int(tokens),
        length=int(length) if isinstance(length, (int, float)) and float(length).is_integer() else None,
        depth=float(depth) if isinstance(depth, (int, float)) and 0 <= depth <= 1 else None,
    )
