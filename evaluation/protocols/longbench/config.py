"""A LongBench run's settings, each declared with its option."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evaluation.catalogue.budgets import Budget
from evaluation.protocols.options import MAX_NEW_TOKENS, MAX_TOKENS, PATHS, ratio_or_token_budgets, whole
from evaluation.protocols.protocol import MODEL_DEFINING
from evaluation.runs.models import ModelSettings
from evaluation.settings import SCORES, setting

DEFAULT_TASKS = ["multi_news"]


@dataclass(kw_only=True)
class LongBenchConfig:
    model: ModelSettings = field(metadata=MODEL_DEFINING)
    data_dir: str | None = setting(
        "--data",
        default=None,
        help="folder with <task>.jsonl and config/ (default: longbench/ of the shared data, else the hub)",
    )
    tasks: list[str] = setting("--tasks", nargs="+", default=DEFAULT_TASKS, help="LongBench v1 English tasks")
    presses: list[str]
    budgets: list[Budget] = ratio_or_token_budgets()
    n: int | None = setting(
        "--n", type=whole(1), default=2, help="examples per task, the first N in file order (default 2)"
    )
    query_aware: bool = setting(
        "--query-aware", defines=SCORES, action="store_true", help="compress the question with the context"
    )
    output: Path
    max_length: int | None = setting(
        "--max-length",
        defines=SCORES,
        type=whole(16, MAX_TOKENS),
        default=None,
        help="prompt truncation length (default: the model's context less the task's answer and 64 tokens)",
    )
    max_new_tokens: int | None = setting(  # generation cap; None: the official length
        "--max-new-tokens",
        defines=SCORES,
        type=whole(1, MAX_NEW_TOKENS),
        default=None,
        help="generation cap (default: each task's official answer length; below it, a departure from the "
        "protocol that the plan and the scorecard say); the answer likelihood keeps the official length",
    )
    path: str = setting(
        "--path",
        choices=list(PATHS),
        default="shared",
        help="shared (default): one full-cache prefill per example serves every press it can, decoded in one "
        "batch; per-cell: the reference, KVPress's prefill under the press once per cell",
    )
    allow_import: bool = False  # import the press specs' import paths (--allow-import)
    likelihood_only: bool = setting(  # the answer's likelihood alone, no generation
        "--likelihood-only",
        defines=SCORES,
        action="store_true",
        help="score only the first gold answer's likelihood under each cache, no generation: each row's score is "
        "its answer_nll (mean nats per token, lower is better); a run of its own (--output)",
    )

    def generation_cap(self, official: int) -> int:
        """How many tokens a cell of a task with ``official`` answer length generates: that length, or
        ``max_new_tokens`` below it; none for ``likelihood_only``."""
        if self.likelihood_only:
            return 0
        return official if self.max_new_tokens is None else min(official, self.max_new_tokens)
