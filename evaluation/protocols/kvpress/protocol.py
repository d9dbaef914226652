"""The ``kvpress`` protocol: any dataset of KVPress's evaluation registry, by its registry name, from a local file
in KVPress's columns or from the hub id the registry names, each example a unit of every press at every budget,
scored by its own benchmark's rule. Its work is ``evaluation.protocols.kvpress.work``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from evaluation.protocols.options import whole
from evaluation.protocols.protocol import SAMPLED, register
from evaluation.protocols.single_turn.config import SingleTurnConfig
from evaluation.protocols.single_turn.protocol import SingleTurnProtocol, add_budget_options, budget_settings
from evaluation.protocols.single_turn.row import CellRow
from evaluation.reporting.conditions import Benchmark
from evaluation.runs.models import ModelSettings


@dataclass
class KVPressConfig(SingleTurnConfig):
    dataset: str = field(default="", metadata=SAMPLED)
    data: str | None = None
    subset: str | None = field(default=None, metadata=SAMPLED)
    n: int | None = field(default=None, metadata=SAMPLED)


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
    implementation = "evaluation.protocols.kvpress.work"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dataset", required=True, help="a name of KVPress's evaluation registry (ruler, ...)")
        parser.add_argument("--data", help="a parquet or JSONL file in KVPress's columns (default: the hub id)")
        parser.add_argument("--subset", help="the hub dataset's subset (KVPress's data_dir), with the hub")
        parser.add_argument("--n", type=whole(1), help="the first N examples (default all)")
        add_budget_options(parser)

    def configure(self, args: argparse.Namespace, model: ModelSettings, output: Path) -> KVPressConfig:
        return KVPressConfig(
            **budget_settings(args, model, output), dataset=args.dataset, data=args.data, subset=args.subset, n=args.n
        )


KVPRESS = register(KVPressDatasets())
