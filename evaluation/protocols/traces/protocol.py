"""The eviction lab as a protocol: record attention traces of real texts, replay every policy at every budget
against Belady, sweep RMM's commit lag, and write the scorecard, the plots and the paper's controlled model. Its
work is ``evaluation.protocols.traces.work``.

Rows (``predictions.jsonl``, one per trace x policy x budget x metric, resumable) hold the metric's mean over
layers as ``score`` and its value per layer; the scorecard's examples are the traces.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from typing_extensions import NotRequired

from evaluation.errors import EvaluationError
from evaluation.protocols.options import probability, whole
from evaluation.protocols.protocol import DEFINES, DEFINING, SAMPLE, SCORES, Protocol, Row, register
from evaluation.protocols.traces import DEFAULT_THRESHOLD, H2O_WINDOW
from evaluation.reporting.conditions import Benchmark
from evaluation.runs.backends import Unit
from evaluation.runs.data_location import shared_data
from evaluation.runs.models import ModelSettings

METRICS = ("retained_mass", "heavy_hitter_recall", "hit_rate")
SUMMARY = "summary"
DEFAULT_TEXTS = ["multi_news:0", "locomo:conv-26"]
# when the replayed RMM learns a row's teacher-forced correctness: as the press does on a model, once the next
# position arrives (``streamed.StreamedPress``); a run recorded before this setting read it as the row arrived
RMM_CORRECTNESS_KNOWN, KNOWN_BEFORE = "at the next position", "on arrival"


@dataclass
class TracesConfig:
    model: ModelSettings = field(metadata={DEFINES: {"model": SAMPLE, "dtype": SCORES}})
    texts: list[str]
    length: int = field(metadata=DEFINING)
    budgets: list[int]
    per_kv_group: bool = field(metadata=DEFINING)
    threshold: float = field(metadata=DEFINING)
    data_root: Path
    output: Path
    h2o_window: int = field(default=H2O_WINDOW, metadata=DEFINING)
    rmm_correctness_known: str = field(default=RMM_CORRECTNESS_KNOWN, metadata=DEFINING)


class TraceRow(Row):
    """One metric of one policy (``press``) at one budget replayed on one trace, with its value per layer; a
    trace's ``summary`` row (empty press and budget) holds what the trace itself shows."""

    trace: str
    metric: str
    per_layer: NotRequired[list[float]]
    text: NotRequired[str]
    length: NotRequired[int]
    teacher_forced_accuracy: NotRequired[float]


def row_key(row: TraceRow) -> tuple[str, str, str, str]:
    return row["trace"], row["press"], row["budget"], row["metric"]


def conditions(row: TraceRow) -> list[str]:
    """The scorecard conditions a trace row counts in: its metric (a trace's summary row counts in none)."""
    return [] if row["metric"] == SUMMARY else [row["metric"]]


BENCHMARK = Benchmark(
    "Traces",
    conditions,
    lambda row: (row["trace"],),
    1,
    3,
    METRICS,
    unit="each condition's own measure",
    cluster_unit="trace",
)
PROTOCOL = "traces"


class Traces(Protocol[TracesConfig]):
    name = PROTOCOL
    help = "eviction lab: replay every policy on real attention traces against Belady"
    description = (
        "Record (or load from the cache) the per-step attention of the model reading real texts, replay every "
        "eviction policy step by step at every budget, with RMM's commit-lag sweep and Belady's offline optimum, and "
        "write the scorecard, its pictures, the paper's section 6 model and run.json."
    )
    benchmark = BENCHMARK
    implementation = "evaluation.protocols.traces.work"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--data",
            type=Path,
            default=shared_data(),
            help="folder holding longbench/ and locomo/ (default $KVET_SHARED_DATA, else shared/data in or beside "
            "the checkout)",
        )
        parser.add_argument(
            "--texts",
            nargs="+",
            default=DEFAULT_TEXTS,
            help=f"multi_news:N (a LongBench context) or locomo:SAMPLE_ID (default {' '.join(DEFAULT_TEXTS)})",
        )
        parser.add_argument(
            "--length", type=whole(65), default=2048, help="tokens per trace (default 2048, at most 4096)"
        )
        parser.add_argument("--budgets", nargs="+", type=whole(1), default=[64, 128, 256, 512], help="positions held")
        parser.add_argument("--per-kv-group", action="store_true", help="one trace per KV group instead of all heads")
        parser.add_argument(
            "--threshold",
            type=probability,
            default=DEFAULT_THRESHOLD,
            help=f"attention that counts as a use ({DEFAULT_THRESHOLD})",
        )
        parser.add_argument(
            "--h2o-window",
            type=whole(0),
            default=H2O_WINDOW,
            help=f"W of recent_window(h2o,window=W), H2O's recent window ({H2O_WINDOW}; 0: none)",
        )

    def configure(self, args: argparse.Namespace, model: ModelSettings, output: Path) -> TracesConfig:
        if args.length > 4096:
            raise EvaluationError(f"--length {args.length} is over 4096: a trace holds length x length per layer")
        return TracesConfig(
            model=model,
            texts=args.texts,
            length=args.length,
            budgets=args.budgets,
            per_kv_group=args.per_kv_group,
            threshold=args.threshold,
            h2o_window=args.h2o_window,
            data_root=args.data,
            output=output,
        )

    def record_defaults(self) -> dict:
        """A run recorded before ``rmm_correctness_known`` existed replayed RMM knowing each row's correctness on
        its arrival: its rows are not this code's, so a resume or a pooled scorecard refuses them."""
        return {**super().record_defaults(), "rmm_correctness_known": KNOWN_BEFORE}

    def options_of(self, settings: dict) -> dict:
        return {**settings, "data": settings.get("data_root")}

    def steps(self, config: TracesConfig, unit: Unit) -> list[frozenset]:
        return self.work().steps(config, unit)

    def row_key(self, row: TraceRow) -> tuple[str, str, str, str]:
        return row_key(row)


TRACES = register(Traces())
