"""The command line: ``python -m evaluation SUBCOMMAND``, one per protocol (LongBench, each streamed task, the
lab, the probe), ``scorecard`` and ``score``.

Settings are layered as KVPress's evaluation layers them: each option's default < a YAML file given with
``--config`` (``evaluation.cli.config_file``: the same flags' types check it) < the command line. Every number is
range-checked here, before any data or model is loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from evaluation.catalogue.specs import DEFAULT_PRESSES, canonical
from evaluation.cli.config_file import with_config
from evaluation.cli.options import fraction, probability, whole
from evaluation.errors import EvaluationError, refused_write
from evaluation.protocols.streaming.task import StreamTask, tasks
from evaluation.protocols.traces import DEFAULT_THRESHOLD, H2O_WINDOW
from evaluation.runs.data_location import shared_data
from evaluation.runs.models import SMOLLM2_ALIAS

DEFAULT_LONGBENCH_TASKS = ["multi_news"]
DEFAULT_RATIOS = [0.5, 0.75]
DEFAULT_TRACE_TEXTS = ["multi_news:0", "locomo:conv-26"]
DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION = ("sdpa", "eager", "flash_attention_2")
RESAMPLES, SEED = 10_000, 0


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=SMOLLM2_ALIAS, help=f"'{SMOLLM2_ALIAS}' (offline default), a hub id or a folder"
    )
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="weights' precision (default float32)")
    parser.add_argument(
        "--attn-implementation",
        choices=ATTENTION,
        default="sdpa",
        help="the model's attention (default sdpa); a press that needs eager weights on the per-cell path runs eager",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu; cuda, cuda:1, mps)")
    parser.add_argument("--device-map", choices=["auto"], help="spread the model over the devices (accelerate)")


def add_common(parser: argparse.ArgumentParser, protocol: str, presses: list[str] | None = DEFAULT_PRESSES) -> None:
    """The options every protocol shares: config file, model, presses (none for the lab), where results go,
    where they run."""
    parser.add_argument("--config", type=Path, help="a YAML file of option values, below the command line")
    add_model_options(parser)
    if presses is not None:
        parser.add_argument(
            "--presses",
            nargs="+",
            type=canonical,
            default=list(presses),
            help=f"press specs (default {' '.join(presses)}): a name, name(param=value, ...), a wrapper "
            "such as adakv(snapkv), or package.module:Class(...); see evaluation/catalogue/specs.py",
        )
    parser.add_argument("--output", type=Path, help=f"run folder (default results/{protocol}/<model>)")
    parser.add_argument("--dry-run", action="store_true", help="print the grid and its work, load no model")
    parser.add_argument("--backend", choices=["local", "ray"], default="local", help="local (default) or ray")
    parser.add_argument("--ray-address", help="Ray cluster to join (default: start a local Ray instance)")
    parser.add_argument(
        "--workers", type=whole(1), help="Ray workers, each loading the model once (default: one per GPU)"
    )
    parser.add_argument("--retries", type=whole(0), default=2, help="retries of a failed unit on Ray (default 2)")


def add_longbench(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "longbench",
        help="LongBench single-turn protocol: every press at every budget",
        description="Run (or resume) the LongBench v1 grid: tasks x examples x presses x budgets. Results go to "
        "OUTPUT/predictions.jsonl (one line per finished cell; rerunning resumes), scorecard.{md,csv} with "
        "pictures, and run.json.",
    )
    add_common(parser, "longbench")
    parser.add_argument("--data", help="folder with <task>.jsonl and config/ (default $LONGBENCH_DIR, else the hub)")
    parser.add_argument("--tasks", nargs="+", default=DEFAULT_LONGBENCH_TASKS, help="LongBench v1 English tasks")
    parser.add_argument("--ratios", nargs="*", type=fraction, help=f"fractions evicted (default {DEFAULT_RATIOS})")
    parser.add_argument("--budgets", nargs="*", type=whole(1), help="context tokens kept")
    parser.add_argument(
        "--n", type=whole(1), default=2, help="examples per task, the first N in file order (default 2)"
    )
    parser.add_argument("--query-aware", action="store_true", help="compress the question with the context")
    parser.add_argument(
        "--max-length",
        type=whole(16),
        help="prompt truncation length (default: the model's context less the task's answer and 64 tokens)",
    )
    parser.add_argument(
        "--path",
        choices=["shared", "per-cell"],
        default="shared",
        help="shared (default): one full-cache prefill per example serves every press it can, decoded in one "
        "batch; per-cell: the reference, KVPress's prefill under the press once per cell",
    )


def add_stream_task(subparsers: argparse._SubParsersAction, task: StreamTask) -> None:
    """A streamed task's subcommand: the options every streamed dataset shares, then the task's own."""
    parser = subparsers.add_parser(task.name, help=task.help, description=task.description)
    add_common(parser, task.name, list(task.presses))
    default = " ".join(map(str, task.budgets))
    parser.add_argument(
        "--budgets", nargs="+", type=whole(1), default=list(task.budgets), help=f"tokens kept (default {default})"
    )
    parser.add_argument(
        "--max-history-tokens",
        type=whole(16),
        help="history limit (default: the model's context less room to answer; larger reads past the context)",
    )
    parser.add_argument(
        "--rmm-weights",
        choices=["answers", "all"],
        default="answers",
        help="rows whose teacher-forced correctness (under rmm(correctness='confidence'): top-1 probability) weighs "
        "in RMM (default: answer tokens only)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=whole(1),
        default=task.max_new_tokens,
        help=f"answer length limit (default {task.max_new_tokens})",
    )
    parser.add_argument(
        "--max-turns",
        type=whole(1),
        help="questions per conversation, the first asked: in file order, or in stream order for the evidence "
        "placement (default all)",
    )
    task.add_options(parser)


def add_traces(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "traces",
        help="eviction lab: replay every policy on real attention traces against Belady",
        description="Record (or load from the cache) the per-step attention of the model reading real texts, "
        "replay every eviction policy step by step at every budget, with RMM's commit-lag sweep and Belady's "
        "offline optimum, and write the scorecard, its pictures, the paper's section 6 model and run.json.",
    )
    add_common(parser, "traces", presses=None)
    parser.add_argument(
        "--data",
        type=Path,
        default=shared_data(),
        help="folder holding longbench/ and locomo/ (default $KVET_SHARED_DATA, else shared/data)",
    )
    parser.add_argument(
        "--texts",
        nargs="+",
        default=DEFAULT_TRACE_TEXTS,
        help=f"multi_news:N (a LongBench context) or locomo:SAMPLE_ID (default {' '.join(DEFAULT_TRACE_TEXTS)})",
    )
    parser.add_argument("--length", type=whole(65), default=2048, help="tokens per trace (default 2048, at most 4096)")
    parser.add_argument("--budgets", nargs="+", type=whole(1), default=[64, 128, 256, 512], help="positions held")
    parser.add_argument("--per-kv-group", action="store_true", help="one trace per KV group instead of all heads")
    parser.add_argument(
        "--threshold",
        type=probability,
        default=DEFAULT_THRESHOLD,
        help=f"attention that counts as a use ({DEFAULT_THRESHOLD})",
    )
    parser.add_argument(
        "--h2o-window",
        type=whole(0),
        default=H2O_WINDOW,
        help=f"W of recent_window(h2o,window=W), H2O's recent window ({H2O_WINDOW}; 0: none)",
    )


def add_probe(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "probe",
        help="mechanism probe: do the scorers rank first the two facts a two-hop answer chains? (section 7)",
        description="Generate (from --seed) two-hop probes of 16 one-sentence facts, let the model answer each "
        "(reasoning first, as a worked example shows), and rank the facts by demonstrated utility over the "
        "answer's rows, H2O, TOVA, SnapKV and recency, each through its press's own score: how often both gold "
        "facts rank in the top 2 and top 4, for correctly and incorrectly answered probes.",
    )
    add_common(parser, "probe", presses=None)
    parser.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    parser.add_argument("--probes", type=whole(1), default=400, help="probes (default 400)")
    parser.add_argument(
        "--no-reasoning", action="store_true", help="answer with the colour alone (default: state the chain first)"
    )
    parser.add_argument("--max-new-tokens", type=whole(1), default=40, help="answer length limit (default 40)")


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
        description="Read any mix of LongBench, LoCoMo and trace run folders and write OUTPUT/scorecard.{md,csv} "
        "and forest.png: per (condition, budget, press) the mean with a 95%% bootstrap interval over examples, "
        "and against the reference press the paired difference with its interval and a verdict (win, tie when "
        "the interval contains 0, loss).",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders holding predictions.jsonl")
    parser.add_argument("--output", type=Path, default=Path("results") / "scorecard" / "combined", help="folder")
    parser.add_argument("--reference", default="h2o", help="the press every other press is compared with")
    parser.add_argument("--resamples", type=whole(1), default=RESAMPLES, help=f"bootstrap resamples ({RESAMPLES})")
    parser.add_argument("--seed", type=int, default=SEED, help=f"bootstrap seed ({SEED})")


def run_protocol(args: argparse.Namespace) -> Path:
    """A protocol run (or its dry run) from parsed options."""
    from evaluation.catalogue.budgets import parse_budgets
    from evaluation.runs.models import ModelSettings

    model = ModelSettings(args.model, args.dtype, args.attn_implementation, args.device, args.device_map)
    if not args.dry_run:  # a dry run plans a GPU machine's run on any machine; a Ray driver plans its workers'
        model.check(here=args.backend == "local")
    output = args.output or Path("results") / args.command / Path(args.model).name
    backend = backend_of(args)
    if args.command == "longbench":
        from evaluation.protocols.longbench.runner import LongBenchConfig, dry_run, run

        ratios = DEFAULT_RATIOS if args.ratios is None and args.budgets is None else args.ratios
        config = LongBenchConfig(
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
        )
    elif args.command in tasks():
        from evaluation.protocols.streaming.config import StreamConfig
        from evaluation.protocols.streaming.runner import dry_run, run

        config = StreamConfig(
            model=model,
            presses=args.presses,
            budgets=parse_budgets(None, args.budgets),
            max_history_tokens=args.max_history_tokens,
            rmm_weights=args.rmm_weights,
            output=output,
            max_new_tokens=args.max_new_tokens,
            max_turns=args.max_turns,
            task=args.command,
            **tasks()[args.command].settings(args),
        )
    elif args.command == "probe":
        from evaluation.protocols.probe.runner import ProbeConfig, dry_run, run

        config = ProbeConfig(model, args.seed, args.probes, not args.no_reasoning, output, args.max_new_tokens)
    else:
        from evaluation.protocols.traces.runner import TracesConfig, dry_run, run

        if args.length > 4096:
            raise EvaluationError(f"--length {args.length} is over 4096: a trace holds length x length per layer")
        config = TracesConfig(
            model=model,
            texts=args.texts,
            length=args.length,
            budgets=args.budgets,
            per_kv_group=args.per_kv_group,
            threshold=args.threshold,
            h2o_window=args.h2o_window,
            data_root=args.data,
            output=output,
        )
    if args.dry_run:
        print(dry_run(config))
        return output
    return run(config, backend)


def backend_of(args: argparse.Namespace):
    from evaluation.runs.backends import Backend

    return Backend(args.backend, args.ray_address, args.workers, args.retries)


def run_scorecard(args: argparse.Namespace) -> Path:
    from evaluation.reporting.combined import load_runs, write_combined

    runs, partial = load_runs(args.runs)
    write_combined(args.output, runs, args.reference, args.resamples, args.seed, partial)
    return args.output


def parser_for_every_command() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m evaluation", description=__doc__, allow_abbrev=False)
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_longbench(subparsers)
    for task in tasks().values():
        add_stream_task(subparsers, task)
    add_traces(subparsers)
    add_probe(subparsers)
    add_scorecard(subparsers)
    add_score(subparsers)
    for subparser in subparsers.choices.values():
        subparser.allow_abbrev = False  # --pres is not --presses
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = parser_for_every_command()
    try:
        try:
            args = with_config(parser, argv)
        except SystemExit as exit_:  # argparse has printed the usage and the error (or the help)
            return exit_.code
        if args.command == "score":
            from evaluation.reporting.rescore import rescore

            print(json.dumps(rescore(args.benchmark, args.file, args.per_row)))
            return 0
        from evaluation.runs.terminal import quiet_libraries

        quiet_libraries()
        if args.command == "scorecard":
            print(f"scorecard: {run_scorecard(args) / 'scorecard.md'}")
        else:
            output = run_protocol(args)
            if not args.dry_run:
                print(f"scorecard: {output / 'scorecard.md'}")
    except EvaluationError as error:  # one line, whatever a message quotes (an inner error's text may hold several)
        print(f"error: {'; '.join(line.strip() for line in str(error).splitlines() if line.strip())}", file=sys.stderr)
        return 2
    except OSError as error:
        if refused_write(error) is None:
            raise
        print(f"error: {refused_write(error)}", file=sys.stderr)
        return 2
    return 0
