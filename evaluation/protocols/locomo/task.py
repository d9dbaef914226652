"""LoCoMo as a streaming task: its conversations, their text, the official scoring and the scorecard's conditions."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from evaluation.catalogue.specs import DEFAULT_PRESSES
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
from evaluation.protocols.protocol import DEFINING
from evaluation.protocols.streaming.config import StreamConfig
from evaluation.protocols.streaming.episodes import Conversation, Question
from evaluation.protocols.streaming.protocol import register_task
from evaluation.protocols.streaming.task import StreamTask
from evaluation.reporting.conditions import Benchmark
from evaluation.runs.record import fingerprint

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
)


@dataclass
class LocomoSettings:
    """LoCoMo's own settings: which conversations, where the questions go, whose answers join the history, and
    the data file."""

    conversations: list[str] | None
    placement: str = field(metadata=DEFINING)
    history: str = field(metadata=DEFINING)
    data: str | None


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


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", help="locomo10.json (default: locomo/ of the shared data, else the download)")
    parser.add_argument("--conversations", nargs="+", help="sample ids such as conv-26 (default: all)")
    parser.add_argument(
        "--placement",
        choices=["file", "evidence"],
        default="file",
        help="file (default, the paper's): the conversation, then the questions in file order; evidence: sessions "
        "streamed one by one, each question right after the session of its last evidence",
    )
    parser.add_argument("--history", choices=["gold", "model"], default="gold", help="answer appended after each turn")


def settings(args: argparse.Namespace) -> LocomoSettings:
    return LocomoSettings(args.conversations, args.placement, args.history, args.data)


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
        add_options=add_options,
        settings=settings,
        presses=DEFAULT_PRESSES,
        budgets=(1800,),
        max_new_tokens=32,
        caveat="; adversarial questions (category 5) are scored by their own rule and kept apart",
        downloads=downloads,
    )
)
