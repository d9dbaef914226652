"""The ``kvpress`` protocol's work: the dataset named and its examples read (a local file, else the hub), its plan
and dry run, and its scorecard."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

from evaluation.errors import EvaluationError
from evaluation.protocols.kvpress.columns import KVPressExample, read_examples
from evaluation.protocols.kvpress.datasets import kvpress_dataset, load_hub, offline_hint, score_example
from evaluation.protocols.kvpress.protocol import KVPressConfig, KVPressDatasets
from evaluation.protocols.protocol import REFERENCE, Implementation, Plan, implement
from evaluation.protocols.ruler.generate import ruler_gold
from evaluation.protocols.single_turn.examples import (
    Gold,
    checked_cells,
    dataset_rooms,
    dry_run_lines,
    first_answer,
    plan_examples,
)
from evaluation.protocols.single_turn.room import check_room
from evaluation.reporting.conditions import ANSWER_NLL
from evaluation.reporting.overlap import overlap_section
from evaluation.reporting.scorecard import scores_frame, summarize
from evaluation.reporting.scorecard import write_scorecard as write_card
from evaluation.runs.record import fingerprint

NEEDLE = "needle_in_haystack"
GOLD: dict[str, Gold] = {"ruler": ruler_gold}  # a dataset whose likelihood is not its first answer's


def examples_of(config: KVPressConfig) -> list[KVPressExample]:
    """The dataset's first ``n`` examples: from ``--data``, else from the hub (with the network)."""
    dataset = kvpress_dataset(config.dataset)
    if config.data:
        return read_examples(Path(config.data))[: config.n]
    if dataset.name == NEEDLE:
        raise EvaluationError(
            f"{NEEDLE}'s hub rows are the haystack without its needle (KVPress inserts it at a depth before running): "
            "run python -m evaluation needle, which inserts it so, or pass --data FILE whose contexts hold it"
        )
    try:
        examples = load_hub(dataset, config.subset)
    except EvaluationError:
        raise
    except Exception as error:  # no network, no hub cache: whatever the hub client raised
        raise EvaluationError(f"{offline_hint(dataset.name)} ({type(error).__name__})") from None
    return examples[: config.n]


def dry_run(protocol: KVPressDatasets, config: KVPressConfig) -> str:
    dataset = kvpress_dataset(config.dataset)
    read = examples_of(config) if config.data else []
    examples = len(read) if config.data else config.n or 0
    source = config.data or f"the hub's {dataset.hub_id}"
    head = f"KVPress dataset {dataset.name} from {source}"
    lines = dry_run_lines(config, head, examples, dataset_rooms(config, read))
    return lines if config.data else f"{lines}\na real run first fetches: {offline_hint(dataset.name)}"


def plan(protocol: KVPressDatasets, config: KVPressConfig) -> Plan:
    dataset = kvpress_dataset(config.dataset)
    cells = checked_cells(config, [])  # its presses before its data, which may come from the hub
    examples = examples_of(config)
    check_room(config.model.name, dataset_rooms(config, examples))
    settings = {"source": config.data or dataset.hub_id}
    if config.data:
        settings["file_fingerprint"] = fingerprint(Path(config.data))
    scorer = partial(score_example, dataset.name)
    return plan_examples(config, examples, cells, scorer, GOLD.get(dataset.name, first_answer), settings)


def write_scorecard(protocol: KVPressDatasets, config: KVPressConfig, rows: list[dict]) -> None:
    if not rows:
        return
    measured = (ANSWER_NLL,) if config.likelihood_only else ()
    summary = summarize(scores_frame(replace(protocol.benchmark, measured=measured), rows), REFERENCE)
    note = (
        f"{config.dataset}, each example scored by its benchmark's rule as KVPress's evaluation scores it (x 100); "
        "each cell: mean [95% bootstrap interval over examples] (n), per task."
    )
    output = config.output
    labels = [budget.label for budget in config.budgets]
    appendix = overlap_section(output, rows, REFERENCE, protocol.benchmark)
    title = f"KVPress {config.dataset}: {output.name}"
    write_card(output, summary, title, note, REFERENCE, config.presses, labels, appendix)


class KVPressWork(Implementation[KVPressConfig]):
    def dry_run(self, protocol: KVPressDatasets, config: KVPressConfig) -> str:
        return dry_run(protocol, config)

    def plan(self, protocol: KVPressDatasets, config: KVPressConfig) -> Plan:
        return plan(protocol, config)

    def write_scorecard(self, protocol: KVPressDatasets, config: KVPressConfig, rows: list[dict]) -> None:
        write_scorecard(protocol, config, rows)


KVPRESS_WORK = KVPressWork()
implement(KVPressDatasets, KVPRESS_WORK)
