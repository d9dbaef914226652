"""A streaming run's settings: those every streamed task shares, and the task's own (``StreamConfig.settings``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from evaluation.catalogue.budgets import Budget
from evaluation.protocols.protocol import DEFINING, MODEL_DEFINING, SAMPLED
from evaluation.runs.models import ModelSettings

PLACEMENTS = ("file", "evidence")
HISTORIES = ("gold", "model")
TEACHER_FORCED_KINDS = {"answers": frozenset({"answer"}), "all": frozenset({"conversation", "question", "answer"})}


class StreamSettings(Protocol):
    """What the run loop reads of a task's own settings (a dataclass of the task's module): which conversations,
    where the questions go and whose answers join the history."""

    conversations: list[str] | None
    placement: str
    history: str


@dataclass
class StreamConfig:
    model: ModelSettings = field(metadata=MODEL_DEFINING)
    task: str = field(metadata=SAMPLED)  # a registered StreamTask's name
    presses: list[str]
    budgets: list[Budget]
    # the questions asked set the room left for them, so the history limit
    max_turns: int | None = field(metadata=DEFINING)
    max_history_tokens: int | None = field(metadata=DEFINING)
    rmm_weights: str = field(metadata=DEFINING)
    output: Path
    max_new_tokens: int = field(metadata=DEFINING)
    settings: StreamSettings  # the task's own, its results-defining fields marked in their metadata
    allow_import: bool = False  # import the press specs' import paths (--allow-import)
    likelihood_only: bool = field(default=False, metadata=DEFINING)  # the answer's likelihood alone, no generation

    @property
    def placement(self) -> str:
        return self.settings.placement

    @property
    def history(self) -> str:
        return self.settings.history

    @property
    def conversations(self) -> list[str] | None:
        return self.settings.conversations
