"""A perplexity run's settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evaluation.catalogue.budgets import Budget
from evaluation.protocols.protocol import DEFINING, MODEL_DEFINING, SAMPLED
from evaluation.runs.models import ModelSettings

EXACT = 1  # --chunk 1: exact per-token eviction


@dataclass
class PerplexityConfig:
    model: ModelSettings = field(metadata=MODEL_DEFINING)
    texts: list[str] = field(metadata=SAMPLED)  # multi_news:N or locomo:SAMPLE_ID
    text_files: list[str] = field(metadata=SAMPLED)  # a user's own texts, one per file
    length: int = field(metadata=DEFINING)  # tokens streamed per text
    presses: list[str]
    budgets: list[Budget]
    chunk: int = field(metadata=DEFINING)  # tokens per forward between evictions (1: exact per-token eviction)
    data_root: Path
    output: Path
    allow_import: bool = False

    @property
    def form(self) -> str:
        """The streaming form, as rows and the scorecard name it."""
        return "exact" if self.chunk == EXACT else f"chunked (every {self.chunk} tokens)"
