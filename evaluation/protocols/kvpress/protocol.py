"""The ``kvpress`` protocol: any dataset of KVPress's evaluation registry, by its registry name, from a local file
in KVPress's columns or from the hub id the registry names, each example a unit of every press at every budget,
scored by its own benchmark's rule. Its work is ``evaluation.protocols.kvpress.work``."""

from __future__ import annotations

from dataclasses import dataclass

from evaluation.protocols.options import whole
from evaluation.protocols.protocol import register
from evaluation.protocols.single_turn.config import SingleTurnConfig
from evaluation.protocols.single_turn.protocol import SingleTurnProtocol
from evaluation.protocols.single_turn.row import CellRow
from evaluation.reporting.conditions import Benchmark
from evaluation.settings import SAMPLE, setting


@dataclass(kw_only=True)
class KVPressConfig(SingleTurnConfig):
    dataset: str = setting(
        "--dataset", defines=SAMPLE, required=True, help="a name of KVPress's evaluation registry (ruler, ...)"
    )
    data: str | None = setting(
        "--data", default=None, help="a parquet or JSONL file in KVPress's columns (default: the hub id)"
    )
    subset: str | None = setting(
        "--subset", defines=SAMPLE, default=None, help="the hub dataset's subset (KVPress's data_dir), with the hub"
    )
    n: int | None = setting(
        "--n", defines=SAMPLE, type=whole(1), default=None, help="the first N examples (default all)"
    )


def conditions(row: CellRow) -> list[str]:
    """A row counts in its task (KVPress's ``task`` column)."""
    return [row["task"]]


class KVPressDatasets(SingleTurnProtocol[KVPressConfig]):
    name = "kvpress"
    help = "any dataset of KVPress's evaluation registry, scored by its own benchmark's rule"
    description = (
        "Run a dataset of KVPress's evaluation registry (--dataset, by its registry name) from a parquet or JSONL "
        "file in KVPress's columns (--data: context, question, answer_prefix, answer, task, max_new_tokens), or "
        "from the hub id the registry names where the network is there; every press at every budget on one shared "
        "prefill, each example scored by its benchmark's rule. Results go to OUTPUT/predictions.jsonl, "
        "scorecard.{md,csv} with pictures, and run.json."
    )
    benchmark = Benchmark("KVPress dataset", conditions, lambda row: (row["task"], row["id"]), 100, 1, unit="points")


KVPRESS = register(KVPressDatasets())
