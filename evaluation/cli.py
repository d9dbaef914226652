"""The command line: ``python -m evaluation longbench | locomo | traces | scorecard | score``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from evaluation.backends import BACKENDS, Backend
from evaluation.budgets import parse_budgets
from evaluation.errors import EvaluationError
from evaluation.metrics.locomo import score as locomo_score
from evaluation.metrics.longbench import sample_score, task_score
from evaluation.models import SMOLLM2_ALIAS
from evaluation.press_specs import DEFAULT_PRESSES, canonical
from evaluation.statistics import DEFAULT_RESAMPLES, DEFAULT_SEED
from evaluation.store import read_rows
from evaluation.traces.policies import DEFAULT_THRESHOLD, H2O_WINDOW

DEFAULT_LONGBENCH_TASKS = ["multi_news"]
DEFAULT_RATIOS = [0.5, 0.75]
DEFAULT_TRACE_TEXTS = ["multi_news:0", "locomo:conv-26"]


def add_run_options(parser: argparse.ArgumentParser, protocol: str) -> None:
    """The options every protocol shares: the model, the presses, where results go, the device."""
    parser.add_argument(
        "--model", default=SMOLLM2_ALIAS, help=f"'{SMOLLM2_ALIAS}' (offline default), a hub id or a folder"
    )
    parser.add_argument(
        "--presses",
        nargs="+",
        type=canonical,
        default=list(DEFAULT_PRESSES),
        help=f"press specs (default {' '.join(DEFAULT_PRESSES)}): a name, name(param=value, ...), a wrapper such as "
        "adakv(snapkv), or package.module:Class(...); see evaluation/press_specs.py",
    )
    add_output_and_backend_options(parser, protocol)


def add_output_and_backend_options(parser: argparse.ArgumentParser, protocol: str) -> None:
    parser.add_argument("--output", type=Path, help=f"run folder (default results/{protocol}/<model>)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu; cuda for GPU workers)")
    parser.add_argument(
        "--backend", choices=BACKENDS, default="local", help="local (default) or ray: units of work on a Ray cluster"
    )
    parser.add_argument("--ray-address", help="Ray cluster to join (default: start a local Ray instance)")
    parser.add_argument("--workers", type=int, help="Ray workers, each loading the model once (default: one per GPU)")
    parser.add_argument("--retries", type=int, default=2, help="retries of a failed unit on Ray (default 2)")


def backend_of(args: argparse.Namespace) -> Backend:
    return Backend(args.backend, args.ray_address, args.workers, args.retries)


def add_longbench(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "longbench",
        help="LongBench single-turn protocol: every press at every budget",
        description="Run (or resume) the LongBench v1 grid: tasks x examples x presses x budgets. Results go to "
        "OUTPUT/predictions.jsonl (one line per finished cell; rerunning resumes), scorecard.{md,csv,png} "
        "and run.json.",
    )
    add_run_options(parser, "longbench")
    parser.add_argument("--tasks", nargs="+", default=DEFAULT_LONGBENCH_TASKS, help="LongBench v1 English tasks")
    parser.add_argument(
        "--ratios", nargs="*", type=float, help=f"compression ratios to evict (default {DEFAULT_RATIOS})"
    )
    parser.add_argument("--budgets", nargs="*", type=int, help="absolute numbers of context tokens to keep")
    parser.add_argument("--n", type=int, default=2, help="examples per task, the first N in file order (default 2)")
    parser.add_argument("--query-aware", action="store_true", help="compress the question with the context")
    parser.add_argument(
        "--data-dir", help="folder with <task>.jsonl and config/ (default $LONGBENCH_DIR, else the hub)"
    )
    parser.add_argument(
        "--max-length",
        type=int,
        help="prompt truncation length (default: the model's context "
        "less the task's max_new_tokens and 64 tokens for the chat template)",
    )
    parser.add_argument(
        "--path",
        choices=["shared", "per-cell"],
        default="shared",
        help="shared (default): one full-cache prefill per example serves every press and budget, decoded in "
        "one batch; per-cell: the reference, KVPress's prefill under the press once per cell",
    )


def add_locomo(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "locomo",
        help="LoCoMo streaming multi-turn protocol: re-compress the growing history before every question",
        description="Stream LoCoMo conversations question by question: before each one, the whole history is "
        "re-compressed to each budget with each press's own score, the question is answered from the compressed "
        "copy, and the question and answer are appended to the uncompressed history. Results go to "
        "OUTPUT/predictions.jsonl (rerunning resumes), scorecard.{md,csv,png} and run.json.",
    )
    add_run_options(parser, "locomo")
    parser.add_argument("--budgets", nargs="+", type=int, default=[1800], help="tokens kept (default 1800)")
    parser.add_argument("--conversations", nargs="+", help="sample ids such as conv-26 (default: all)")
    parser.add_argument("--max-turns", type=int, help="questions per conversation, in file order (default: all)")
    parser.add_argument(
        "--max-history-tokens",
        type=int,
        help="drop the oldest sessions beyond this many tokens "
        "(default: the model's context less room for the questions and answers)",
    )
    parser.add_argument("--history", choices=["gold", "model"], default="gold", help="answer appended after each turn")
    parser.add_argument(
        "--placement",
        choices=["file", "evidence"],
        default="file",
        help="file (default, the paper's): the conversation, then the questions in file order; evidence: sessions "
        "streamed one by one, each question right after the session of its last evidence",
    )
    parser.add_argument(
        "--rmm-weights",
        choices=["answers", "all"],
        default="answers",
        help="rows whose teacher-forced correctness weighs in RMM (default: answer tokens only)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=32, help="answer length limit (default 32)")
    parser.add_argument("--data", help="locomo10.json (default $LOCOMO_PATH, else the official download)")


def add_traces(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "traces",
        help="eviction lab: replay every policy on real attention traces against Belady",
        description="Record (or load from the cache) the per-step attention of the model reading real texts, "
        "replay every eviction policy step by step at every budget, with RMM's commit-lag sweep and Belady's "
        "offline optimum, and write OUTPUT/predictions.jsonl (resumable), scorecard.{md,csv}, "
        "retained_mass.png, lag_sweep.png, controlled.{png,json} (the paper's section 6 model) and run.json.",
    )
    parser.add_argument(
        "--model", default=SMOLLM2_ALIAS, help=f"'{SMOLLM2_ALIAS}' (offline default), a hub id or a folder"
    )
    parser.add_argument(
        "--texts",
        nargs="+",
        default=DEFAULT_TRACE_TEXTS,
        help=f"multi_news:N (a LongBench context) or locomo:SAMPLE_ID (default {' '.join(DEFAULT_TRACE_TEXTS)})",
    )
    parser.add_argument("--length", type=int, default=2048, help="tokens per trace (default 2048, at most 4096)")
    parser.add_argument("--budgets", nargs="+", type=int, default=[64, 128, 256, 512], help="positions held")
    parser.add_argument("--per-kv-group", action="store_true", help="one trace per KV group instead of all heads")
    parser.add_argument(
        "--threshold", type=float, default=DEFAULT_THRESHOLD, help="attention that counts as a use (Belady's requests)"
    )
    parser.add_argument(
        "--h2o-window", type=int, default=H2O_WINDOW, help=f"H2O's recent window (default {H2O_WINDOW})"
    )
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"), help="holds longbench/ and locomo/")
    add_output_and_backend_options(parser, "traces")


def add_score(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("score", help="rescore a JSONL file of predictions with the official metrics")
    parser.add_argument("benchmark", choices=["longbench", "locomo"])
    parser.add_argument(
        "file",
        type=Path,
        help='JSONL; longbench: {"task", "prediction", "answers", "all_classes"}, '
        'locomo: {"category", "prediction", "answer"} per line',
    )
    parser.add_argument("--per-row", action="store_true", help='add a "rows" list of per-line scores in file order')


def add_scorecard(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "scorecard",
        help="one scorecard across LongBench, LoCoMo and trace runs, with bootstrap intervals and win/tie/loss",
        description="Read the results of any mix of LongBench, LoCoMo and trace run folders and write "
        "OUTPUT_ROOT/NAME/scorecard.{md,csv,png}: per (condition, budget, press) the mean with a 95%% paired "
        "bootstrap interval over examples, and against the reference press the paired difference with its "
        "interval and a verdict (win, tie when the interval contains 0, loss).",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders holding predictions.jsonl")
    parser.add_argument("--reference", default="h2o", help="the press every other press is compared with")
    parser.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, help="bootstrap resamples (10000)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="bootstrap seed (0)")
    parser.add_argument("--name", default="combined", help="folder name under the output root")
    parser.add_argument("--output-root", type=Path, default=Path("results") / "scorecard")


def run_scorecard(args: argparse.Namespace) -> Path:
    from evaluation.comparison import compare, load_run, write_comparison

    if args.resamples < 1:
        raise EvaluationError("--resamples must be at least 1")
    output = args.output_root / args.name
    comparisons = compare([load_run(run) for run in args.runs], args.reference, args.resamples, args.seed)
    write_comparison(output, comparisons, args.reference, args.resamples, args.seed)
    return output


def score_longbench(rows: list[dict], per_row: bool) -> dict:
    scores = [sample_score(r["task"], r["prediction"], r["answers"], r.get("all_classes")) for r in rows]
    by_task: dict[str, list[float]] = {}
    for row, score in zip(rows, scores, strict=True):
        by_task.setdefault(row["task"], []).append(score)
    result: dict = {task: task_score(values) for task, values in by_task.items()}
    if per_row:
        result["rows"] = scores
    return result


def score_locomo(rows: list[dict], per_row: bool) -> dict:
    scores = [locomo_score(int(r["category"]), r["prediction"], r["answer"]) for r in rows]
    by_category: dict[str, list[float]] = {}
    for row, value in zip(rows, scores, strict=True):
        by_category.setdefault(str(int(row["category"])), []).append(value)
    result: dict = {key: sum(v) / len(v) for key, v in sorted(by_category.items())}
    result["overall"] = sum(scores) / len(scores) if scores else 0.0
    if per_row:
        result["rows"] = scores
    return result


def run_longbench(args: argparse.Namespace) -> Path:
    from evaluation.longbench.runner import LongBenchConfig, run

    ratios = DEFAULT_RATIOS if args.ratios is None and args.budgets is None else args.ratios
    return run(
        LongBenchConfig(
            model=args.model,
            tasks=args.tasks,
            presses=args.presses,
            budgets=parse_budgets(ratios, args.budgets),
            n=args.n,
            query_aware=args.query_aware,
            data_dir=args.data_dir,
            output=args.output or Path("results") / "longbench" / Path(args.model).name,
            device=args.device,
            max_length=args.max_length,
            path=args.path,
        ),
        backend_of(args),
    )


def run_traces(args: argparse.Namespace) -> Path:
    from evaluation.traces.runner import TracesConfig, run

    if not 64 < args.length <= 4096:
        raise EvaluationError(f"--length {args.length} must be in (64, 4096]: a trace holds length x length per layer")
    return run(
        TracesConfig(
            model=args.model,
            texts=args.texts,
            length=args.length,
            budgets=args.budgets,
            per_kv_group=args.per_kv_group,
            threshold=args.threshold,
            h2o_window=args.h2o_window,
            data_root=args.data_root,
            output=args.output or Path("results") / "traces" / Path(args.model).name,
            device=args.device,
        ),
        backend_of(args),
    )


def run_locomo(args: argparse.Namespace) -> Path:
    from evaluation.locomo.runner import LoCoMoConfig, run

    return run(
        LoCoMoConfig(
            model=args.model,
            presses=args.presses,
            budgets=parse_budgets(None, args.budgets),
            conversations=args.conversations,
            max_turns=args.max_turns,
            max_history_tokens=args.max_history_tokens,
            placement=args.placement,
            history=args.history,
            rmm_weights=args.rmm_weights,
            data=args.data,
            output=args.output or Path("results") / "locomo" / Path(args.model).name,
            device=args.device,
            max_new_tokens=args.max_new_tokens,
        ),
        backend_of(args),
    )


def quiet_libraries() -> None:
    """Without a terminal, no weight-loading or download bars (a log would hold thousands of redraws)."""
    from evaluation.backends import interactive

    if not interactive():
        import huggingface_hub.utils
        import transformers

        transformers.utils.logging.disable_progress_bar()
        huggingface_hub.utils.disable_progress_bars()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluation", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_longbench(subparsers)
    add_locomo(subparsers)
    add_traces(subparsers)
    add_scorecard(subparsers)
    add_score(subparsers)
    args = parser.parse_args(argv)
    quiet_libraries()
    try:
        if args.command == "longbench":
            print(f"scorecard: {run_longbench(args) / 'scorecard.md'}")
        elif args.command == "locomo":
            print(f"scorecard: {run_locomo(args) / 'scorecard.md'}")
        elif args.command == "traces":
            print(f"scorecard: {run_traces(args) / 'scorecard.md'}")
        elif args.command == "scorecard":
            print(f"scorecard: {run_scorecard(args) / 'scorecard.md'}")
        elif args.benchmark == "longbench":
            print(json.dumps(score_longbench(read_rows(args.file), args.per_row)))
        else:
            print(json.dumps(score_locomo(read_rows(args.file), args.per_row)))
    except EvaluationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
