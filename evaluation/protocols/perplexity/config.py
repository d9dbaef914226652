"""A perplexity run's settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evaluation.catalogue.budgets import Budget
from evaluation.protocols.protocol import DEFINING, MODEL_DEFINING, SAMPLED
from evaluation.runs.models import ModelSettings

EXACT = 1  # --chunk 1: exact per-token eviction
BATCHED = "batched"  # a row's path: streamed in one batch with the other presses at its budget
CELL_BY_CELL = "per-cell"  # a row's path: its cell streamed as a batch of its own (the full cache always is)


@dataclass
class PerplexityConfig:
    model: ModelSettings = field(metadata=MODEL_DEFINING)
    texts: list[str] = field(metadata=SAMPLED)  # multi_news:N, locomo:SAMPLE_ID or essays:N
    text_files: list[str] = field(metadata=SAMPLED)  # a user's own texts, one per file
    length: int = field(metadata=DEFINING)  # tokens streamed per text
    presses: list[str]
    budgets: list[Budget]
    chunk: int = field(metadata=DEFINING)  # tokens per forward between evictions (1: exact per-token eviction)
    data_root: Path
    output: Path
    allow_import: bool = False
    cells_one_at_a_time: bool = False  # stream each press at each budget as a batch of its own (the reference)

    @property
    def path(self) -> str:
        """How the cells stream, as run.json records it."""
        return CELL_BY_CELL if self.cells_one_at_a_time else BATCHED

    @property
    def form(self) -> str:
        """The streaming form, as rows and the scorecard name it."""
        return "exact" if self.chunk == EXACT else f"chunked (every {self.chunk} tokens)"
