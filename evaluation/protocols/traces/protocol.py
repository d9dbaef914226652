"""The eviction lab as a protocol: record attention traces of real texts, replay every policy at every budget
against Belady, sweep RMM's commit lag, and write the scorecard, the plots and the paper's controlled model. Its
work is ``evaluation.protocols.traces.work``.

Rows (``predictions.jsonl``, one per trace x policy x budget x metric, resumable) hold the metric's mean over
layers as ``score`` and its value per layer; the scorecard's examples are the traces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from typing_extensions import NotRequired

from evaluation.errors import EvaluationError
from evaluation.protocols.options import probability, whole
from evaluation.protocols.protocol import Protocol, Row, register
from evaluation.protocols.traces import DEFAULT_THRESHOLD, H2O_WINDOW
from evaluation.reporting.conditions import Benchmark
from evaluation.runs.data_location import shared_data
from evaluation.runs.models import ModelSettings
from evaluation.settings import DEFINES, DEFINING, SAMPLE, SCORES, setting

METRICS = ("retained_mass", "heavy_hitter_recall", "hit_rate")
SUMMARY = "summary"
DEFAULT_TEXTS = ["multi_news:0", "locomo:conv-26"]
# when the replayed RMM learns a row's teacher-forced correctness: as the press does on a model, once the next
# position arrives (``streamed.StreamedPress``); a run recorded before this setting read it as the row arrived
RMM_CORRECTNESS_KNOWN, KNOWN_BEFORE = "at the next position", "on arrival"


@dataclass(kw_only=True)
class TracesConfig:
    model: ModelSettings = field(metadata={DEFINES: {"model": SAMPLE, "dtype": SCORES}})
    data_root: Path = setting(
        "--data",
        type=Path,
        default=shared_data(),
        help="folder holding longbench/ and locomo/ (default $KVET_SHARED_DATA, else shared/data in or beside "
        "the checkout)",
    )
    texts: list[str] = setting(
        "--texts",
        nargs="+",
        default=DEFAULT_TEXTS,
        help=f"multi_news:N (a LongBench context) or locomo:SAMPLE_ID (default {' '.join(DEFAULT_TEXTS)})",
    )
    length: int = setting(
        "--length", defines=SCORES, type=whole(65), default=2048, help="tokens per trace (default 2048, at most 4096)"
    )
    budgets: list[int] = setting(
        "--budgets", nargs="+", type=whole(1), default=[64, 128, 256, 512], help="positions held"
    )
    per_kv_group: bool = setting(
        "--per-kv-group", defines=SCORES, action="store_true", help="one trace per KV group instead of all heads"
    )
    threshold: float = setting(
        "--threshold",
        defines=SCORES,
        type=probability,
        default=DEFAULT_THRESHOLD,
        help=f"attention that counts as a use ({DEFAULT_THRESHOLD})",
    )
    output: Path
    h2o_window: int = setting(
        "--h2o-window",
        defines=SCORES,
        type=whole(0),
        default=H2O_WINDOW,
        help=f"W of recent_window(h2o,window=W), H2O's recent window ({H2O_WINDOW}; 0: none)",
    )
    rmm_correctness_known: str = field(default=RMM_CORRECTNESS_KNOWN, metadata=DEFINING)

    def __post_init__(self) -> None:
        if self.length > 4096:
            raise EvaluationError(f"--length {self.length} is over 4096: a trace holds length x length per layer")


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

    def record_defaults(self) -> dict:
        """A run recorded before ``rmm_correctness_known`` existed replayed RMM knowing each row's correctness on
        its arrival: its rows are not this code's, so a resume or a pooled scorecard refuses them."""
        return {**super().record_defaults(), "rmm_correctness_known": KNOWN_BEFORE}

    def row_key(self, row: TraceRow) -> tuple[str, str, str, str]:
        return row_key(row)


TRACES = register(Traces())
