"""What a protocol tells its scorecard: the conditions a row counts in, what identifies an example, and the
metrics its rows hold (``Metric``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """A quantity a scorecard reports per example, in every table and picture: the row field that holds it, how it
    is shown, and which way is better.

    ``scale`` multiplies the row's value; ``bounded``: the values lie in [0, scale], so both sides at 0 or both at
    ``scale`` in every pair carry no signal; ``output``: the row field whose equality in every pair makes two presses
    identical (None: equal values do)."""

    name: str
    unit: str
    digits: int
    scale: float = 1.0
    field: str = "score"
    higher_is_better: bool = True
    bounded: bool = True
    output: str | None = "prediction"

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"

    @property
    def label(self) -> str:
        """The axis label: name, unit and direction."""
        return f"{self.name} ({self.unit}; {self.direction})"


ANSWER_NLL = Metric(
    "answer NLL", "nats per token", 3, field="answer_nll", higher_is_better=False, bounded=False, output=None
)  # the first gold answer's mean negative log-likelihood per token, where a row has an answer


@dataclass(frozen=True)
class Contrast:
    """The paired difference of two conditions of one press at one budget, over matched pairs of examples (a
    reused code against its control): ``pair`` names the pair a row belongs to; ``note``, what the difference
    measures, goes beside its section of the scorecard."""

    minuend: str
    subtrahend: str
    pair: Callable[[dict], tuple]
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.minuend} - {self.subtrahend}"


@dataclass(frozen=True)
class PressContrast:
    """Every spec of one press (``press``: its name, as ``rmm`` names ``rmm`` and ``rmm(lag=64)``) against a
    baseline press (a spec) at each budget and condition, paired by example: the paper's section 8 sets RMM against
    SnapKV and StreamingLLM."""

    press: str
    baseline: str

    @property
    def name(self) -> str:
        return f"{self.press} against {self.baseline}"


# the paper's section 8: RMM (every spec of it that ran) against SnapKV and StreamingLLM at each budget; and
# against its random-weight control (issue 62: does correctness carry information beyond dropping rows?). Every
# benchmark where RMM runs declares them (LongBench, LoCoMo, the synthetic families).
RANDOM_CONTROL = "rmm(correctness='random')"
SECTION_8 = (
    PressContrast("rmm", "snapkv"),
    PressContrast("rmm", "streaming_llm"),
    PressContrast("rmm", RANDOM_CONTROL),
)


@dataclass(frozen=True)
class Benchmark:
    """A protocol's scorecard: its conditions, what identifies an example, and its official score (``scale``,
        ``digits``, ``unit``). ``measured``: the metrics its scorecard reports; empty: the official score, then the gold
        answer's likelihood (``ANSWER_NLL``) where rows hold it. ``press_contrasts``: the press-against-baseline
        comparisons its scorecard adds to those against the reference and the full cache (an exploratory Holm family of
    their own). ``cluster``: the unit examples share (LoCoMo's questions a conversation), named by ``cluster_unit``;
    intervals come from a bootstrap of these units and tests from sign flips of their summed differences."""

    name: str
    conditions: Callable[[dict], list[str]]  # the conditions a row counts in
    example_id: Callable[[dict], tuple]
    scale: float  # LongBench reports 100 x mean, LoCoMo the mean F1
    digits: int
    order: tuple[str, ...] = ()  # the protocol's own order of its conditions, if it has one
    contrasts: tuple[Contrast, ...] = ()
    unit: str = "official score"
    measured: tuple[Metric, ...] = ()
    press_contrasts: tuple[PressContrast, ...] = ()
    cluster: Callable[[dict], object] | None = None  # the unit a row shares with others; None: its example alone
    cluster_unit: str = "example"  # what ``cluster`` names (a conversation, an episode, a document)

    def cluster_of(self, row: dict) -> object:
        """The unit that ``row``'s example shares with others: intervals resample these, tests flip their signs."""
        return self.cluster(row) if self.cluster else self.example_id(row)

    @property
    def score(self) -> Metric:
        """The official score."""
        return Metric("score", self.unit, self.digits, self.scale)

    @property
    def metrics(self) -> tuple[Metric, ...]:
        return self.measured or (self.score, ANSWER_NLL)
