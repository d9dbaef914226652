"""The LongBench single-turn protocol: every example x press x budget, one JSON line per finished cell. Its work
(plan, dry run, scorecard) is ``evaluation.protocols.longbench.work``."""

from __future__ import annotations

import argparse
from pathlib import Path

from typing_extensions import NotRequired

from evaluation.catalogue.budgets import budget_of, parse_budgets
from evaluation.catalogue.specs import DEFAULT_PRESSES
from evaluation.protocols.longbench.config import PATHS, LongBenchConfig
from evaluation.protocols.options import MAX_NEW_TOKENS, MAX_TOKENS, fraction, whole
from evaluation.protocols.protocol import LIKELIHOOD, Protocol, register
from evaluation.protocols.single_turn.row import CellRow
from evaluation.reporting.conditions import Benchmark, PressContrast
from evaluation.runs.models import ModelSettings

DEFAULT_TASKS = ["multi_news"]
DEFAULT_RATIOS = [0.5, 0.75]


class LongBenchRow(CellRow):
    """One LongBench cell; ``all_classes``: the classification tasks' label set."""

    all_classes: NotRequired[list[str] | None]


def conditions(row: LongBenchRow) -> list[str]:
    """The scorecard conditions a LongBench row counts in: its task."""
    return [row["task"]]


# the paper's section 8: RMM (every spec of it that ran) against SnapKV and StreamingLLM at each budget
SECTION_8 = (PressContrast("rmm", "snapkv"), PressContrast("rmm", "streaming_llm"))


class LongBench(Protocol[LongBenchConfig]):
    name = "longbench"
    help = "LongBench single-turn protocol: every press at every budget"
    description = (
        "Run (or resume) the LongBench v1 grid: tasks x examples x presses x budgets. Results go to "
        "OUTPUT/predictions.jsonl (one line per finished cell; rerunning resumes), scorecard.{md,csv} with "
        "pictures, and run.json."
    )
    benchmark = Benchmark(
        "LongBench",
        conditions,
        lambda row: (row["task"], row["id"]),
        100,
        2,
        unit="points, 100 x mean",
        press_contrasts=SECTION_8,
    )
    likelihood = LIKELIHOOD
    presses = DEFAULT_PRESSES
    implementation = "evaluation.protocols.longbench.work"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--data", help="folder with <task>.jsonl and config/ (default: longbench/ of the shared data, else the hub)"
        )
        parser.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, help="LongBench v1 English tasks")
        parser.add_argument("--ratios", nargs="*", type=fraction, help=f"fractions evicted (default {DEFAULT_RATIOS})")
        parser.add_argument("--budgets", nargs="*", type=whole(1), help="context tokens kept")
        parser.add_argument(
            "--n", type=whole(1), default=2, help="examples per task, the first N in file order (default 2)"
        )
        parser.add_argument("--query-aware", action="store_true", help="compress the question with the context")
        parser.add_argument(
            "--max-length",
            type=whole(16, MAX_TOKENS),
            help="prompt truncation length (default: the model's context less the task's answer and 64 tokens)",
        )
        parser.add_argument(
            "--max-new-tokens",
            type=whole(1, MAX_NEW_TOKENS),
            help="generation cap (default: each task's official answer length; below it, a departure from the "
            "protocol that the plan and the scorecard say); the answer likelihood keeps the official length",
        )
        parser.add_argument(
            "--path",
            choices=list(PATHS),
            default="shared",
            help="shared (default): one full-cache prefill per example serves every press it can, decoded in one "
            "batch; per-cell: the reference, KVPress's prefill under the press once per cell",
        )

        parser.add_argument(
            "--likelihood-only",
            action="store_true",
            help="score only the first gold answer's likelihood under each cache, no generation: each row's score is "
            "its answer_nll (mean nats per token, lower is better); a run of its own (--output)",
        )

    def record_defaults(self) -> dict:
        # what older runs did not record: they generated the official length
        return {**super().record_defaults(), "likelihood_only": False, "max_new_tokens": None}

    def configure(self, args: argparse.Namespace, model: ModelSettings, output: Path) -> LongBenchConfig:
        ratios = DEFAULT_RATIOS if args.ratios is None and args.budgets is None else args.ratios
        return LongBenchConfig(
            model=model,
            tasks=args.tasks,
            presses=args.presses,
            budgets=parse_budgets(ratios, args.budgets),
            n=args.n,
            query_aware=args.query_aware,
            data_dir=args.data,
            output=output,
            max_length=args.max_length,
            path=args.path,
            allow_import=args.allow_import,
            likelihood_only=args.likelihood_only,
            max_new_tokens=args.max_new_tokens,
        )

    def options_of(self, settings: dict) -> dict:
        budgets = [budget_of(key) for key in settings.get("budgets", [])]
        ratios = [budget.value for budget in budgets if budget.kind == "ratio"]
        tokens = [int(budget.value) for budget in budgets if budget.kind == "tokens"]
        return {**settings, "data": settings.get("data_dir"), "ratios": ratios, "budgets": tokens}

    def row_key(self, row: LongBenchRow) -> tuple[str, str, str, str]:
        return row["task"], row["id"], row["press"], row["budget"]


LONGBENCH = register(LongBench())
