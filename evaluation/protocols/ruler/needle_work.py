"""The needle-in-a-haystack protocol's work: its examples placed for the model's tokenizer, its plan and dry run,
and its scorecard with the heatmaps."""

from __future__ import annotations

from evaluation.errors import EvaluationError
from evaluation.protocols.kvpress.columns import KVPressExample
from evaluation.protocols.kvpress.datasets import score_example
from evaluation.protocols.protocol import Implementation, Plan, implement
from evaluation.protocols.ruler.card import write_needle_scorecard
from evaluation.protocols.ruler.needle import MAX_NEW_TOKENS, needle_examples
from evaluation.protocols.ruler.protocol import Needle, NeedleConfig
from evaluation.protocols.ruler.work import tokenizer_of
from evaluation.protocols.single_turn.examples import (
    checked_cells,
    dry_run_lines,
    exported,
    first_answer,
    plan_examples,
)
from evaluation.protocols.single_turn.room import Room

DATASET = "needle_in_haystack"  # its name in KVPress's evaluation registry


def needle_score(prediction: str, example: KVPressExample) -> float:
    """KVPress's needle-in-a-haystack rule."""
    return score_example(DATASET, prediction, example)


def checked_depths(config: NeedleConfig) -> None:
    outside = [depth for depth in config.depths if depth > 100]
    if outside:
        raise EvaluationError(f"--depths {outside}: a depth is a percent of the context, 0 to 100")


def rooms(config: NeedleConfig) -> list[Room]:
    """What the examples need of a context at each length: the whole haystack prompt (a cut could drop the
    needle) and the answer."""
    what = "a haystack prompt of up to {0} tokens (--lengths {0})"
    return [Room(DATASET, MAX_NEW_TOKENS, n, what.format(n), remedy="shorter --lengths") for n in config.lengths]


def dry_run(protocol: Needle, config: NeedleConfig) -> str:
    checked_depths(config)
    head = f"Needle in a haystack at {', '.join(map(str, config.lengths))} tokens x depths {config.depths}%"
    return dry_run_lines(config, head, len(config.lengths) * len(config.depths), rooms(config))


def plan(protocol: Needle, config: NeedleConfig) -> Plan:
    checked_depths(config)
    cells = checked_cells(config, rooms(config))
    examples = needle_examples(tokenizer_of(config), config.lengths, config.depths, config.seed)
    return plan_examples(config, exported(examples, config.export), cells, needle_score, first_answer, {})


def write_scorecard(protocol: Needle, config: NeedleConfig, rows: list[dict]) -> None:
    if rows:
        write_needle_scorecard(protocol.benchmark, config, rows)


class NeedleWork(Implementation[NeedleConfig]):
    def dry_run(self, protocol: Needle, config: NeedleConfig) -> str:
        return dry_run(protocol, config)

    def plan(self, protocol: Needle, config: NeedleConfig) -> Plan:
        return plan(protocol, config)

    def write_scorecard(self, protocol: Needle, config: NeedleConfig, rows: list[dict]) -> None:
        write_scorecard(protocol, config, rows)


NEEDLE_WORK = NeedleWork()
implement(Needle, NEEDLE_WORK)
