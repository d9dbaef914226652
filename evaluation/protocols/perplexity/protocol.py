"""The perplexity protocol: texts streamed through the model token by token (or chunk by chunk), each press holding
the cache at each budget as the text arrives, as TOVA's and StreamingLLM's papers evaluate; one row per text x press
x budget with its mean negative log-likelihood per scored token. Its work is
``evaluation.protocols.perplexity.work``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import ClassVar

from evaluation.catalogue.budgets import parse_budgets
from evaluation.catalogue.specs import FULL_CACHE
from evaluation.protocols.options import MAX_TOKENS, whole
from evaluation.protocols.perplexity.config import CELL_BY_CELL, EXACT, PerplexityConfig
from evaluation.protocols.protocol import Protocol, Row, register
from evaluation.reporting.conditions import Benchmark, Metric
from evaluation.runs.data_location import shared_data
from evaluation.runs.models import ModelSettings

DEFAULT_TEXTS = [*(f"multi_news:{i}" for i in range(4)), *(f"locomo:conv-{n}" for n in (26, 30, 41, 42))]
DEFAULT_PRESSES = (FULL_CACHE, "streaming_llm", "tova", "h2o", "rmm", "rmm(lag=64)")
DEFAULT_BUDGETS = [64, 128, 256]
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
    implementation = "evaluation.protocols.perplexity.work"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--data",
            type=Path,
            default=shared_data(),
            help="folder holding longbench/ and locomo/ (default $KVET_SHARED_DATA, else shared/data)",
        )
        parser.add_argument(
            "--texts",
            nargs="*",
            default=DEFAULT_TEXTS,
            help=f"multi_news:N or locomo:SAMPLE_ID (default {' '.join(DEFAULT_TEXTS)})",
        )
        parser.add_argument("--text-file", nargs="+", default=[], help="your own texts, one per file (UTF-8)")
        parser.add_argument(
            "--length", type=whole(2, MAX_TOKENS), default=1024, help="tokens streamed per text (default 1024)"
        )
        parser.add_argument(
            "--budgets", nargs="+", type=whole(1), default=DEFAULT_BUDGETS, help="cached tokens held (64 128 256)"
        )
        parser.add_argument(
            "--chunk",
            type=whole(1),
            default=EXACT,
            help="tokens per forward between evictions: 1 (default) evicts after every token (exact); C > 1 every C "
            "tokens (faster; presses that read a window of queries need C at least their window)",
        )
        parser.add_argument(
            "--cells-one-at-a-time",
            action="store_true",
            help="stream each press at each budget as a batch of its own (the reference path; by default every "
            "press at a budget streams in one batch, one forward per token for them all)",
        )

    def configure(self, args: argparse.Namespace, model: ModelSettings, output: Path) -> PerplexityConfig:
        return PerplexityConfig(
            model=model,
            texts=args.texts,
            text_files=args.text_file,
            length=args.length,
            presses=args.presses,
            budgets=parse_budgets(None, args.budgets),
            chunk=args.chunk,
            data_root=args.data,
            output=output,
            allow_import=args.allow_import,
            cells_one_at_a_time=args.cells_one_at_a_time,
        )

    def options_of(self, settings: dict) -> dict:
        budgets = [budget["value"] for budget in settings.get("budgets", [])]
        return {
            **settings,
            "data": settings.get("data_root"),
            "text_file": settings.get("text_files"),
            "budgets": budgets,
            "cells_one_at_a_time": settings.get("cells_one_at_a_time", True),  # a run from before batching: per cell
        }

    def row_key(self, row: PerplexityRow) -> tuple[str, str, str]:
        return row["text"], row["press"], row["budget"]


PERPLEXITY = register(Perplexity())
