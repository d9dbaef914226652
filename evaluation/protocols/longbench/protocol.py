"""The LongBench single-turn protocol: every example x press x budget, one JSON line per finished cell. Its work
(plan, dry run, scorecard) is ``evaluation.protocols.longbench.work``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from typing_extensions import NotRequired

from evaluation.catalogue.specs import DEFAULT_PRESSES
from evaluation.errors import EvaluationError
from evaluation.metrics.longbench import sample_score, task_score
from evaluation.protocols.longbench.config import LongBenchConfig
from evaluation.protocols.protocol import LIKELIHOOD, Protocol, register
from evaluation.protocols.single_turn.row import CellRow
from evaluation.reporting.conditions import SECTION_8, Benchmark
from evaluation.reporting.rescoring import Rescoring, checked, scored

if TYPE_CHECKING:
    import pandas as pd


class LongBenchRow(CellRow):
    """One LongBench cell; ``all_classes``: the classification tasks' label set."""

    all_classes: NotRequired[list[str] | None]


def conditions(row: LongBenchRow) -> list[str]:
    """The scorecard conditions a LongBench row counts in: its task."""
    return [row["task"]]


def check_line(path: Path, line: int, row: dict, task: object) -> None:
    checked(path, line, row, (*RESCORED, *(["all_classes"] if "all_classes" in row else [])))
    if not row["answers"]:
        raise EvaluationError(f"{path}: line {line}: an empty answers list would score 0; give the gold answers")


def task_scores(frame: pd.DataFrame) -> dict:
    """The official task score (100 x mean, 2 decimals) per task, in the order first seen."""
    return frame.groupby("group", sort=False)["score"].agg(task_score).to_dict()


RESCORED = ("task", "prediction", "answers")
RESCORING = Rescoring(
    RESCORED,
    '{"task", "prediction", "answers", "all_classes"}',
    lambda path, line, row: row.get("task"),
    check_line,
    lambda path, line, row, task: scored(
        path, line, sample_score, row["task"], row["prediction"], row["answers"], row.get("all_classes")
    ),
    task_scores,
)


class LongBench(Protocol[LongBenchConfig]):
    name = "longbench"
    help = "LongBench single-turn protocol: every press at every budget"
    description = (
        "Run (or resume) the LongBench v1 grid: tasks x examples x presses x budgets. Results go to "
        "OUTPUT/predictions.jsonl (one line per finished cell; rerunning resumes), scorecard.{md,csv} with "
        "pictures, and run.json."
    )
    benchmark = Benchmark(
        "LongBench",
        conditions,
        lambda row: (row["task"], row["id"]),
        100,
        2,
        unit="points, 100 x mean",
        press_contrasts=SECTION_8,
    )
    likelihood = LIKELIHOOD
    presses = DEFAULT_PRESSES
    rescoring = RESCORING

    def record_defaults(self) -> dict:
        # what older runs did not record: they generated the official length
        return {**super().record_defaults(), "likelihood_only": False, "max_new_tokens": None}

    def row_key(self, row: LongBenchRow) -> tuple[str, str, str, str]:
        return row["task"], row["id"], row["press"], row["budget"]


LONGBENCH = register(LongBench())
