"""The perplexity protocol: texts streamed through the model token by token (or chunk by chunk), each press holding
the cache at each budget as the text arrives, as TOVA's and StreamingLLM's papers evaluate; one row per text x press
x budget with its mean negative log-likelihood per scored token. Its work is
``evaluation.protocols.perplexity.work``."""

from __future__ import annotations

from typing import ClassVar

from evaluation.catalogue.specs import FULL_CACHE
from evaluation.protocols.perplexity.config import CELL_BY_CELL, PerplexityConfig
from evaluation.protocols.protocol import Protocol, Row, register
from evaluation.reporting.conditions import Benchmark, Metric

DEFAULT_PRESSES = (FULL_CACHE, "streaming_llm", "tova", "h2o", "rmm", "rmm(lag=64)")
POSITION_WINDOW = 32  # scored tokens per point of a row's NLL against position


class PerplexityRow(Row):
    """One text streamed under one press at one budget: ``nll`` (= ``score``) is the mean negative log-likelihood
    per scored token (nats; every token after the first is scored), ``nll_by_position`` its mean over each window
    of ``POSITION_WINDOW`` scored tokens. ``streamed_as`` names what streamed a press whose one-row score is not its
    rule (H2O). ``path``: ``batched`` (streamed in one batch with the other presses at its budget) or ``per-cell``
    (its cell a batch of its own; equal within float rounding). A cell the press cannot hold holds its identity and
    ``error`` alone."""

    text: str
    tokens: int
    nll: float
    nll_by_position: list[float]
    form: str
    streamed_as: str
    path: str


STREAMED_NLL = Metric(
    "NLL", "nats per token", 4, higher_is_better=False, bounded=False, output=None
)  # a streamed text's mean negative log-likelihood per scored token (the row's score)


def conditions(row: PerplexityRow) -> list[str]:
    return ["perplexity"]


class Perplexity(Protocol[PerplexityConfig]):
    name = "perplexity"
    help = "perplexity of texts streamed with each press holding the cache at each budget"
    description = (
        "Stream texts (multi_news documents, LoCoMo conversations, or --text-file) through the model, each press "
        "evicting down to each budget as the text arrives (exact: after every token; --chunk C: every C tokens), "
        "and score every token after the first. Results go to OUTPUT/predictions.jsonl (one line per text x press x "
        "budget; rerunning resumes), scorecard.{md,csv} with pictures, and run.json."
    )
    benchmark = Benchmark(
        "Perplexity", conditions, lambda row: (row["text"],), 1, 4, measured=(STREAMED_NLL,), cluster_unit="text"
    )
    presses = DEFAULT_PRESSES
    row_defaults: ClassVar[dict[str, object]] = {"path": CELL_BY_CELL}  # a row from before batching: per cell

    def record_defaults(self) -> dict:
        # a run from before batching streamed each cell as a batch of its own
        return {**super().record_defaults(), "cells_one_at_a_time": True}

    def row_key(self, row: PerplexityRow) -> tuple[str, str, str]:
        return row["text"], row["press"], row["budget"]


PERPLEXITY = register(Perplexity())
