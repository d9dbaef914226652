"""The settings every single-turn protocol of KVPress-format examples shares (RULER, needle-in-a-haystack,
KVPress's datasets)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evaluation.catalogue.budgets import Budget
from evaluation.protocols.protocol import DEFINING, MODEL_DEFINING
from evaluation.runs.models import ModelSettings

PATHS = ("shared", "per-cell")
DEFAULT_RATIOS = [0.5, 0.75]


@dataclass
class SingleTurnConfig:
    model: ModelSettings = field(metadata=MODEL_DEFINING)
    presses: list[str]
    budgets: list[Budget]
    output: Path
    query_aware: bool = field(default=False, metadata=DEFINING)
    likelihood_only: bool = field(default=False, metadata=DEFINING)  # the answer's likelihood alone, no generation
    path: str = "shared"
    allow_import: bool = False  # import the press specs' import paths (--allow-import)

    def generation_cap(self, official: int) -> int:
        """How many tokens a cell generates: the task's ``official`` length, none for ``likelihood_only``."""
        return 0 if self.likelihood_only else official
