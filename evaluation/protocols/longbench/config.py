"""A LongBench run's settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evaluation.catalogue.budgets import Budget
from evaluation.protocols.protocol import DEFINING, MODEL_DEFINING
from evaluation.runs.models import ModelSettings

PATHS = ("shared", "per-cell")


@dataclass
class LongBenchConfig:
    model: ModelSettings = field(metadata=MODEL_DEFINING)
    tasks: list[str]
    presses: list[str]
    budgets: list[Budget]
    n: int | None
    query_aware: bool = field(metadata=DEFINING)
    data_dir: str | None
    output: Path
    max_length: int | None = field(default=None, metadata=DEFINING)
    path: str = "shared"
    allow_import: bool = False  # import the press specs' import paths (--allow-import)
    likelihood_only: bool = field(default=False, metadata=DEFINING)  # the answer's likelihood alone, no generation
    max_new_tokens: int | None = field(default=None, metadata=DEFINING)  # generation cap; None: the official length

    def generation_cap(self, official: int) -> int:
        """How many tokens a cell of a task with ``official`` answer length generates: that length, or
        ``max_new_tokens`` below it; none for ``likelihood_only``."""
        if self.likelihood_only:
            return 0
        return official if self.max_new_tokens is None else min(official, self.max_new_tokens)
