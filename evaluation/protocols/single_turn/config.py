"""The settings every single-turn protocol of KVPress-format examples shares (RULER, needle-in-a-haystack,
KVPress's datasets), each declared with its option: budgets, query, likelihood, path."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evaluation.catalogue.budgets import Budget
from evaluation.protocols.options import PATHS, ratio_or_token_budgets
from evaluation.protocols.protocol import MODEL_DEFINING
from evaluation.runs.models import ModelSettings
from evaluation.settings import SCORES, setting


@dataclass(kw_only=True)
class SingleTurnConfig:
    model: ModelSettings = field(metadata=MODEL_DEFINING)
    presses: list[str]
    budgets: list[Budget] = ratio_or_token_budgets()
    output: Path
    query_aware: bool = setting(
        "--query-aware", defines=SCORES, action="store_true", help="compress the question with the context"
    )
    likelihood_only: bool = setting(  # the answer's likelihood alone, no generation
        "--likelihood-only",
        defines=SCORES,
        action="store_true",
        help="score only the gold answer's likelihood under each cache, no generation (a run of its own)",
    )
    path: str = setting(
        "--path",
        choices=list(PATHS),
        default="shared",
        help="shared (default): one full-cache prefill per example serves every press it can; per-cell: KVPress's "
        "prefill under the press once per cell",
    )
    allow_import: bool = False  # import the press specs' import paths (--allow-import)

    def generation_cap(self, official: int) -> int:
        """How many tokens a cell generates: the task's ``official`` length, none for ``likelihood_only``."""
        return 0 if self.likelihood_only else official
