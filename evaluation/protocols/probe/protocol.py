"""The probe protocol (its work: ``evaluation.protocols.probe.work``): the model answers each probe, then every
scorer ranks its sixteen facts.

For each probe the model reads the prompt (``probe.prompt``) and answers greedily. One uncompressed prefill of the
prompt and the answer (``engine.History``) then serves every scorer's own ``score`` of every position:

- ``demonstrated utility``: ``RMMPress(lag=None)`` with Eq. 1's weights on the rows whose prediction is a token of
  the model's own answer (its teacher-forced correctness against that answer: 1 for every greedy row) and 0 on
  the prompt's rows, so only what the answer attended to counts;
- ``demonstrated utility (confidence)``: the same rows weighed by the model's probability of its top-1 prediction;
- ``h2o`` (``ObservedAttentionPress``: attention accumulated over every row), ``tova`` and ``snapkv``;
- ``recency``: the facts by position, the newest first.

Rows (``predictions.jsonl``, one per probe x scorer x k, resumable) score 1 when both gold facts rank in the top
k of 16 (``probe.ranking``); a row's ``prediction`` is the scorer's order of the facts, ``model_answer`` the
model's text. The scorecard splits them by whether the model answered correctly, then (``probe.positions``) by
that and the older gold fact's recency rank. ``--gold-positions middle`` places the gold facts 7th and 9th of the
16 (``facts.MIDDLE``), where recency cannot find them; ``recency-5-8`` at two of the 9th to 12th (``facts.RECENCY_5_8``:
recency ranks 5 to 8, where, in the shuffled run, demonstrated utility rose on the correctly answered probes and
recency did not), where recency's top 4 holds neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from typing_extensions import NotRequired

from evaluation.protocols.options import MAX_GENERATED, MAX_NEW_TOKENS, whole
from evaluation.protocols.probe.facts import FACTS, PLACEMENT_TEXTS, PLACEMENTS, SHUFFLED
from evaluation.protocols.protocol import MODEL_DEFINING, Protocol, Row, register
from evaluation.reporting.conditions import Benchmark
from evaluation.runs.backends import Unit
from evaluation.runs.models import ModelSettings
from evaluation.settings import SAMPLE, SCORES, setting

RECENCY = "recency"
PROTOCOL = "probe"
DU, DU_CONFIDENCE = "demonstrated utility", "demonstrated utility (confidence)"
SCORERS = (DU, DU_CONFIDENCE, "h2o", "tova", "snapkv", RECENCY)
OVERALL, CORRECT, INCORRECT = "overall", "answered correctly", "answered incorrectly"
BLOCK = 20  # probes per unit of work


@dataclass(kw_only=True)
class ProbeConfig:
    model: ModelSettings = field(metadata=MODEL_DEFINING)
    seed: int = setting("--seed", defines=SAMPLE, type=int, default=0, help="the generator's seed (default 0)")
    probes: int = setting("--probes", type=whole(1, MAX_GENERATED), default=400, help="probes (default 400)")
    reasoning: bool = setting(
        "--no-reasoning",
        defines=SCORES,
        read=lambda args: not args.no_reasoning,
        written=lambda recorded: {"no_reasoning": not recorded},
        action="store_true",
        help="answer with the colour alone (default: state the chain first)",
    )
    output: Path
    max_new_tokens: int = setting(
        "--max-new-tokens",
        defines=SCORES,
        type=whole(1, MAX_NEW_TOKENS),
        default=40,
        help="answer length limit (default 40)",
    )
    gold_positions: str = setting(  # where the gold facts stand (``PLACEMENTS``)
        "--gold-positions",
        defines=SCORES,
        choices=list(PLACEMENTS),
        default=SHUFFLED,
        help="where the two gold facts stand, the distractors around them in their shuffled order: "
        + "; ".join(f"{name}: {PLACEMENT_TEXTS[name]}" for name in PLACEMENTS)
        + f" (default {SHUFFLED})",
    )


def top_label(k: int) -> str:
    return f"top {k} of {FACTS}"


class ProbeRow(Row):
    """One scorer (``press``) on one probe at one k (``budget``: top k of the facts): 1 when both gold facts rank in
    its top k; ``prediction`` is its order of the facts."""

    probe: int
    correct: bool
    answer_correct: bool
    bridge_named: bool
    model_answer: str
    answer: str
    prompt_tokens: int
    answer_tokens: int
    mean_confidence: float | None
    gold_ranks: NotRequired[list[int]]  # absent for a scorer that failed (``error``)
    prediction: NotRequired[str]
    answer_nll: NotRequired[float | None]  # the gold answer's mean negative log-likelihood per token (nats)
    gold_answer_tokens: NotRequired[int]  # its tokens, cut to --max-new-tokens


PROBE_LIKELIHOOD = ("answer_nll", "gold_answer_tokens")  # ``answer_tokens`` counts the model's own answer


def row_key(row: ProbeRow) -> tuple[int, str, str]:
    return row["probe"], row["press"], row["budget"]


def conditions(row: ProbeRow) -> list[str]:
    return [OVERALL, CORRECT if row["correct"] else INCORRECT]


BENCHMARK = Benchmark(
    "Probe",
    conditions,
    lambda row: (row["probe"],),
    100,
    1,
    (OVERALL, CORRECT, INCORRECT),
    unit="% of probes",
    cluster_unit="probe",
)


class Probes(Protocol[ProbeConfig]):
    name = PROTOCOL
    help = "mechanism probe: do the scorers rank first the two facts a two-hop answer chains? (section 7)"
    description = (
        "Generate (from --seed) two-hop probes of 16 one-sentence facts, let the model answer each (reasoning first, "
        "as a worked example shows), and rank the facts by demonstrated utility over the answer's rows, H2O, TOVA, "
        "SnapKV and recency, each through its press's own score: how often both gold facts rank in the top 2 and top "
        "4, for correctly and incorrectly answered probes."
    )
    benchmark = BENCHMARK
    likelihood = PROBE_LIKELIHOOD

    def record_defaults(self) -> dict:
        """A run recorded before ``--gold-positions`` existed placed its gold facts where the shuffle put them."""
        return {**super().record_defaults(), "gold_positions": SHUFFLED}

    def steps(self, config: ProbeConfig, unit: Unit) -> list[frozenset]:
        """One group per probe: a probe's rows come from its own prefill and answer alone."""
        return [frozenset(key for key in unit.keys if key[0] == probe.index) for probe in unit.payload]

    def row_key(self, row: ProbeRow) -> tuple[int, str, str]:
        return row_key(row)


PROBES = register(Probes())
