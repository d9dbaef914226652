"""A streaming run's settings: what defines its results, and the choices the protocol offers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evaluation.catalogue.budgets import Budget
from evaluation.runs.models import ModelSettings

PLACEMENTS = ("file", "evidence")
HISTORIES = ("gold", "model")
TEACHER_FORCED_KINDS = {"answers": frozenset({"answer"}), "all": frozenset({"conversation", "question", "answer"})}
RESULTS_DEFINING = (
    "task",
    "episodes",
    "model",
    "dtype",
    "attn_implementation",
    "placement",
    "history",
    "rmm_weights",
    "max_turns",  # the questions asked set the room left for them, so the history limit
    "max_history_tokens",
    "max_new_tokens",
    "device",
    "data_fingerprint",
)


@dataclass
class StreamConfig:
    model: ModelSettings
    presses: list[str]
    budgets: list[Budget]
    conversations: list[str] | None
    max_turns: int | None
    max_history_tokens: int | None
    history: str
    rmm_weights: str
    data: str | None
    output: Path
    max_new_tokens: int = 32
    placement: str = "file"
    task: str = "locomo"  # a registered StreamTask's name
    episodes: dict = field(default_factory=dict)  # a generated task's generator settings
