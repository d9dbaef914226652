"""The streaming multi-turn protocol, one registered protocol per ``StreamTask``: the history grows session by
session and turn by turn, and before every question it is re-compressed to each budget with each press's own code.
Its work (plan, dry run, scorecard) is ``evaluation.protocols.streaming.work``; one conversation's stream is
``evaluation.protocols.streaming.conversation``."""

from __future__ import annotations

import argparse
from pathlib import Path

from typing_extensions import NotRequired

from evaluation.protocols.protocol import LIKELIHOOD, Protocol, Row, register, scores_settings
from evaluation.protocols.streaming.config import StreamConfig
from evaluation.protocols.streaming.task import StreamTask
from evaluation.runs.models import ModelSettings
from evaluation.settings import add_options, configured, option_values


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
        self.rescoring = task.rescoring

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        """The options every streamed task shares, at the task's defaults, then the task's own."""
        task = self.task
        add_options(parser, StreamConfig, {"budgets": list(task.budgets), "max_new_tokens": task.max_new_tokens})
        add_options(parser, task.settings)

    def configure(self, args: argparse.Namespace, model: ModelSettings, output: Path) -> StreamConfig:
        settings = configured(self.task.settings, args)
        return configured(StreamConfig, args, model=model, output=output, task=self.name, settings=settings)

    def scores_settings(self) -> list[str]:
        """The shared configuration's ``SCORES`` fields and the task's own settings'."""
        return [*super().scores_settings(), *scores_settings(self.task.settings)]

    def record_defaults(self) -> dict:
        # what older runs did not record
        return {**ModelSettings().record(), "task": "locomo", "episodes": {}, "likelihood_only": False}

    def options_of(self, settings: dict) -> dict:
        recorded = {**self.record_defaults(), **settings}
        return {**super().options_of(settings), **option_values(self.task.settings, recorded)}

    def row_key(self, row: QuestionRow) -> tuple[str, int, str, str]:
        return row_key(row)


def register_task(task: StreamTask) -> StreamTask:
    """Register a streamed task as a protocol of its own."""
    register(Streamed(task))
    return task
