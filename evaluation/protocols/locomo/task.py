"""LoCoMo as a streaming task: its conversations, their text, the official scoring and the scorecard's conditions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from evaluation.catalogue.specs import DEFAULT_PRESSES
from evaluation.errors import EvaluationError
from evaluation.metrics.locomo import CATEGORIES, PAPER_ORDER, score
from evaluation.protocols.locomo.data import LOCOMO_URL, load_conversations, local_path, resolve_path
from evaluation.protocols.locomo.render import (
    choice_options,
    gold_answer,
    header,
    question_prompt,
    render_session,
    resolve_choice,
)
from evaluation.protocols.streaming.config import StreamConfig
from evaluation.protocols.streaming.episodes import Conversation, Question
from evaluation.protocols.streaming.protocol import register_task
from evaluation.protocols.streaming.task import StreamTask
from evaluation.reporting.conditions import SECTION_8, Benchmark
from evaluation.reporting.rescoring import Rescoring, checked, scored
from evaluation.runs.record import fingerprint
from evaluation.settings import SCORES, setting

if TYPE_CHECKING:
    import pandas as pd

OVERALL = "overall (1-4)"
VISIBLE = "evidence visible"


def conditions(row: dict) -> list[str]:
    """The scorecard conditions a LoCoMo row counts in: categories 1-4 overall, by turn regime, with the
    evidence visible, and by category; adversarial questions (5), scored by their own rule, only apart."""
    category = f"{CATEGORIES[row['category']]} ({row['category']})"
    if row["category"] == 5:
        return [category]
    regime = "first turn" if row["turn"] == 0 else "later turns"
    return [OVERALL, regime, *([VISIBLE] if row["evidence_visible"] else []), category]


CONDITION_ORDER = (OVERALL, "first turn", "later turns", VISIBLE, *(f"{CATEGORIES[c]} ({c})" for c in PAPER_ORDER))
BENCHMARK = Benchmark(
    "LoCoMo",
    conditions,
    lambda row: (row["conversation"], row["question_index"]),
    1,
    3,
    CONDITION_ORDER,
    unit="F1, 0 to 1; adversarial: its own rule",
    cluster=lambda row: row["conversation"],
    cluster_unit="conversation",
    press_contrasts=SECTION_8,
)


@dataclass(kw_only=True)
class LocomoSettings:
    """LoCoMo's own settings: the data file, which conversations, where the questions go, and whose answers join
    the history."""

    data: str | None = setting(
        "--data", default=None, help="locomo10.json (default: locomo/ of the shared data, else the download)"
    )
    conversations: list[str] | None = setting(
        "--conversations", nargs="+", default=None, help="sample ids such as conv-26 (default: all)"
    )
    placement: str = setting(
        "--placement",
        defines=SCORES,
        choices=["file", "evidence"],
        default="file",
        help="file (default, the paper's): the conversation, then the questions in file order; evidence: sessions "
        "streamed one by one, each question right after the session of its last evidence",
    )
    history: str = setting(
        "--history",
        defines=SCORES,
        choices=["gold", "model"],
        default="gold",
        help="answer appended after each turn",
    )


def load(config: StreamConfig) -> tuple[dict[str, str], list[Conversation]]:
    path = resolve_path(config.settings.data)
    return fingerprint(path), load_conversations(path)


def downloads(config: StreamConfig) -> str:
    return "" if local_path(config.settings.data) else f"locomo10.json from {LOCOMO_URL}"


def locomo_scored(conversation: Conversation, question: Question, prediction: str) -> tuple[str, float]:
    """The official rule of the question's category; a category 5 letter answer is scored as its option."""
    scored = (
        resolve_choice(prediction, choice_options(conversation, question)) if question.category == 5 else prediction
    )
    return scored, score(question.category, scored, gold_answer(question))


ABSTENTION = 5  # the adversarial category: scored on the prediction alone, with no gold answer


def category_of(path: Path, line: int, row: dict) -> int:
    try:
        return int(row.get("category"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise EvaluationError(f"{path}: line {line}: category {row.get('category')!r} is not LoCoMo's 1 to 5") from None


def check_line(path: Path, line: int, row: dict, category: object) -> None:
    given = (*(["scored_prediction"] if "scored_prediction" in row else []), "prediction")
    checked(path, line, row, given if category == ABSTENTION else (*given, "answer"))


def category_scores(frame: pd.DataFrame) -> dict:
    """The mean F1 per category and overall."""
    result = {str(key): value for key, value in frame.groupby("group")["score"].mean().items()}
    return result | {"overall": float(frame["score"].mean())}


# each line's ``scored_prediction`` where a run wrote one (an adversarial letter answer as its option's text, which
# only the run's rendered options tell), else its ``prediction``
RESCORING = Rescoring(
    ("category", "prediction", "answer"),
    '{"category", "prediction", "answer"}',
    category_of,
    check_line,
    lambda path, line, row, category: scored(
        path, line, score, category, row.get("scored_prediction", row["prediction"]), row.get("answer")
    ),
    category_scores,
)

LOCOMO = register_task(
    StreamTask(
        name="locomo",
        help="LoCoMo streaming multi-turn protocol: re-compress the growing history before every question",
        description="Stream LoCoMo conversations question by question: before each one, the whole history is "
        "re-compressed to each budget with each press's own code, the question is answered from the compressed "
        "copy, and the question and answer are appended to the uncompressed history.",
        load=load,
        header=header,
        render_session=render_session,
        question_prompt=question_prompt,
        gold_answer=gold_answer,
        scored=locomo_scored,
        benchmark=BENCHMARK,
        metric="F1",
        settings=LocomoSettings,
        presses=DEFAULT_PRESSES,
        budgets=(1800,),
        max_new_tokens=32,
        caveat="; adversarial questions (category 5) are scored by their own rule and kept apart",
        downloads=downloads,
        rescoring=RESCORING,
    )
)
