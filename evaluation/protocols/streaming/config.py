"""A streaming run's settings, each declared with its option: those every streamed task shares, and the task's
own (``StreamConfig.settings``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from evaluation.catalogue.budgets import Budget
from evaluation.protocols.options import MAX_NEW_TOKENS, MAX_TOKENS, token_budgets, whole
from evaluation.protocols.protocol import MODEL_DEFINING
from evaluation.runs.models import ModelSettings
from evaluation.settings import SAMPLED, SCORES, setting

PLACEMENTS = ("file", "evidence")
HISTORIES = ("gold", "model")
TEACHER_FORCED_KINDS = {"answers": frozenset({"answer"}), "all": frozenset({"conversation", "question", "answer"})}


class StreamSettings(Protocol):
    """What the run loop reads of a task's own settings (a dataclass of the task's module): which conversations,
    where the questions go and whose answers join the history."""

    conversations: list[str] | None
    placement: str
    history: str


@dataclass(kw_only=True)
class StreamConfig:
    """The settings every streamed task shares; ``budgets`` and ``max_new_tokens`` default to the task's own
    (``StreamTask``)."""

    model: ModelSettings = field(metadata=MODEL_DEFINING)
    task: str = field(metadata=SAMPLED)  # a registered StreamTask's name
    presses: list[str]
    budgets: list[Budget] = token_budgets(help=lambda default: f"tokens kept (default {' '.join(map(str, default))})")
    max_history_tokens: int | None = setting(
        "--max-history-tokens",
        defines=SCORES,
        type=whole(16, MAX_TOKENS),
        default=None,
        help="history limit (default: the model's context less room to answer; larger reads past the context)",
    )
    rmm_weights: str = setting(
        "--rmm-weights",
        defines=SCORES,
        choices=["answers", "all"],
        default="answers",
        help="rows whose teacher-forced correctness (under rmm(correctness='confidence'): top-1 probability) "
        "weighs in RMM (default: answer tokens only)",
    )
    output: Path
    max_new_tokens: int = setting(
        "--max-new-tokens",
        defines=SCORES,
        type=whole(1, MAX_NEW_TOKENS),
        help=lambda default: f"answer length limit (default {default})",
    )
    # the questions asked set the room left for them, so the history limit
    max_turns: int | None = setting(
        "--max-turns",
        defines=SCORES,
        type=whole(1),
        default=None,
        help="questions per conversation, the first asked: in file order, or in stream order for the evidence "
        "placement (default all)",
    )
    likelihood_only: bool = setting(  # the answer's likelihood alone, no generation
        "--likelihood-only",
        defines=SCORES,
        action="store_true",
        help="score only the gold answer's likelihood under each cache, no generation (gold history): each "
        "row's score is its answer_nll (mean nats per token, lower is better); a run of its own (--output)",
    )
    settings: StreamSettings  # the task's own, declared with their options, results-defining ones marked
    allow_import: bool = False  # import the press specs' import paths (--allow-import)

    @property
    def placement(self) -> str:
        return self.settings.placement

    @property
    def history(self) -> str:
        return self.settings.history

    @property
    def conversations(self) -> list[str] | None:
        return self.settings.conversations
