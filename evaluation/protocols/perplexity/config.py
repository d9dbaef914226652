"""A perplexity run's settings, each declared with its option."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evaluation.catalogue.budgets import Budget
from evaluation.protocols.options import MAX_TOKENS, token_budgets, whole
from evaluation.protocols.protocol import MODEL_DEFINING
from evaluation.runs.data_location import shared_data
from evaluation.runs.models import ModelSettings
from evaluation.settings import SAMPLE, SCORES, setting

EXACT = 1  # --chunk 1: exact per-token eviction
BATCHED = "batched"  # a row's path: streamed in one batch with the other presses at its budget
CELL_BY_CELL = "per-cell"  # a row's path: its cell streamed as a batch of its own (the full cache always is)
DEFAULT_TEXTS = [*(f"multi_news:{i}" for i in range(4)), *(f"locomo:conv-{n}" for n in (26, 30, 41, 42))]
DEFAULT_BUDGETS = [64, 128, 256]


@dataclass(kw_only=True)
class PerplexityConfig:
    model: ModelSettings = field(metadata=MODEL_DEFINING)
    data_root: Path = setting(
        "--data",
        type=Path,
        default=shared_data(),
        help="folder holding longbench/ and locomo/ (default $KVET_SHARED_DATA, else shared/data)",
    )
    texts: list[str] = setting(
        "--texts",
        defines=SAMPLE,
        nargs="*",
        default=DEFAULT_TEXTS,
        help=f"multi_news:N, locomo:SAMPLE_ID or essays:N (default {' '.join(DEFAULT_TEXTS)})",
    )
    text_files: list[str] = setting(  # a user's own texts, one per file
        "--text-file", defines=SAMPLE, nargs="+", default=[], help="your own texts, one per file (UTF-8)"
    )
    length: int = setting(
        "--length",
        defines=SCORES,
        type=whole(2, MAX_TOKENS),
        default=1024,
        help="tokens streamed per text (default 1024)",
    )
    presses: list[str]
    budgets: list[Budget] = token_budgets(default=DEFAULT_BUDGETS, help="cached tokens held (64 128 256)")
    chunk: int = setting(  # tokens per forward between evictions (1: exact per-token eviction)
        "--chunk",
        defines=SCORES,
        type=whole(1),
        default=EXACT,
        help="tokens per forward between evictions: 1 (default) evicts after every token (exact); C > 1 every C "
        "tokens (faster; presses that read a window of queries need C at least their window)",
    )
    output: Path
    allow_import: bool = False
    cells_one_at_a_time: bool = setting(  # stream each press at each budget as a batch of its own (the reference)
        "--cells-one-at-a-time",
        action="store_true",
        help="stream each press at each budget as a batch of its own (the reference path; by default every "
        "press at a budget streams in one batch, one forward per token for them all)",
    )

    @property
    def path(self) -> str:
        """How the cells stream, as run.json records it."""
        return CELL_BY_CELL if self.cells_one_at_a_time else BATCHED

    @property
    def form(self) -> str:
        """The streaming form, as rows and the scorecard name it."""
        return "exact" if self.chunk == EXACT else f"chunked (every {self.chunk} tokens)"
