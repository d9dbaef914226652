"""The streaming multi-turn protocol, one registered protocol per ``StreamTask``: the history grows session by
session and turn by turn, and before every question it is re-compressed to each budget with each press's own code.
Its work (plan, dry run, scorecard) is ``evaluation.protocols.streaming.work``; one conversation's stream is
``evaluation.protocols.streaming.conversation``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_type_hints

from typing_extensions import NotRequired

from evaluation.catalogue.budgets import budget_of, parse_budgets
from evaluation.protocols.options import MAX_NEW_TOKENS, MAX_TOKENS, whole
from evaluation.protocols.protocol import LIKELIHOOD, Protocol, Row, register, scores_settings
from evaluation.protocols.streaming.config import StreamConfig
from evaluation.protocols.streaming.task import StreamTask
from evaluation.runs.backends import Unit
from evaluation.runs.models import ModelSettings


class QuestionRow(Row):
    """One question (``conversation``, ``question_index``) answered under one press at one budget; a task adds its
    own fields (``StreamTask.row_fields``), and ``retention`` where it measures it. A failed cell holds no
    answer."""

    conversation: str
    question_index: int
    turn: int
    category: int | str
    history_tokens: int
    evidence_visible: bool
    placement: str
    question: NotRequired[str]
    answer: NotRequired[str | int | float]
    compression_ratio: NotRequired[float]
    kept_tokens: NotRequired[int]
    history_mode: NotRequired[str]
    rmm_weights: NotRequired[str]
    path: NotRequired[str]
    prediction: NotRequired[str]
    scored_prediction: NotRequired[str]
    overlap_with_reference: NotRequired[list[float] | None]  # per layer, mean Jaccard over KV heads with h2o's
    overlap_min_head: NotRequired[list[float] | None]  # per layer, the least KV head's
    retention: NotRequired[float | None]
    answer_nll: NotRequired[float | None]  # the gold answer's mean negative log-likelihood per token (nats)
    answer_tokens: NotRequired[int]  # its tokens, cut to the answer limit


def row_key(row: QuestionRow) -> tuple[str, int, str, str]:
    return row["conversation"], row["question_index"], row["press"], row["budget"]


class Streamed(Protocol[StreamConfig]):
    """A streamed task as a protocol: the options every streamed task shares, then the task's own."""

    likelihood = LIKELIHOOD

    def __init__(self, task: StreamTask) -> None:
        self.task = task
        self.name, self.help, self.description = task.name, task.help, task.description
        self.benchmark, self.presses = task.benchmark, task.presses
        self.implementation = "evaluation.protocols.streaming.work"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        task = self.task
        default = " ".join(map(str, task.budgets))
        parser.add_argument(
            "--budgets", nargs="+", type=whole(1), default=list(task.budgets), help=f"tokens kept (default {default})"
        )
        parser.add_argument(
            "--max-history-tokens",
            type=whole(16, MAX_TOKENS),
            help="history limit (default: the model's context less room to answer; larger reads past the context)",
        )
        parser.add_argument(
            "--rmm-weights",
            choices=["answers", "all"],
            default="answers",
            help="rows whose teacher-forced correctness (under rmm(correctness='confidence'): top-1 probability) "
            "weighs in RMM (default: answer tokens only)",
        )
        parser.add_argument(
            "--max-new-tokens",
            type=whole(1, MAX_NEW_TOKENS),
            default=task.max_new_tokens,
            help=f"answer length limit (default {task.max_new_tokens})",
        )
        parser.add_argument(
            "--max-turns",
            type=whole(1),
            help="questions per conversation, the first asked: in file order, or in stream order for the evidence "
            "placement (default all)",
        )
        parser.add_argument(
            "--likelihood-only",
            action="store_true",
            help="score only the gold answer's likelihood under each cache, no generation (gold history): each "
            "row's score is its answer_nll (mean nats per token, lower is better); a run of its own (--output)",
        )
        task.add_options(parser)

    def configure(self, args: argparse.Namespace, model: ModelSettings, output: Path) -> StreamConfig:
        return StreamConfig(
            model=model,
            task=self.name,
            presses=args.presses,
            budgets=parse_budgets(None, args.budgets),
            max_turns=args.max_turns,
            max_history_tokens=args.max_history_tokens,
            rmm_weights=args.rmm_weights,
            output=output,
            max_new_tokens=args.max_new_tokens,
            settings=self.task.settings(args),
            allow_import=args.allow_import,
            likelihood_only=args.likelihood_only,
        )

    def scores_settings(self) -> list[str]:
        """The shared configuration's ``SCORES`` fields and the task's own settings'."""
        return [*super().scores_settings(), *scores_settings(get_type_hints(self.task.settings)["return"])]

    def record_defaults(self) -> dict:
        # what older runs did not record
        return {**ModelSettings().record(), "task": "locomo", "episodes": {}, "likelihood_only": False}

    def options_of(self, settings: dict) -> dict:
        tokens = [int(budget_of(key).value) for key in settings.get("budgets", [])]
        return {**settings, **self.task.options_of(settings.get("episodes") or {}), "budgets": tokens}

    def steps(self, config: StreamConfig, unit: Unit) -> list[frozenset]:
        return self.work().steps(self, config, unit)

    def row_key(self, row: QuestionRow) -> tuple[str, int, str, str]:
        return row_key(row)


def register_task(task: StreamTask) -> StreamTask:
    """Register a streamed task as a protocol of its own."""
    register(Streamed(task))
    return task
