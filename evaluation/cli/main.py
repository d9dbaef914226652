"""The command line: ``python -m evaluation SUBCOMMAND``, one per registered protocol (LongBench, each streamed
task, the lab, the probe), the reporting commands ``scorecard`` and ``score``, and ``reproduce``.

Every subcommand comes from a registry: the protocols' (``evaluation.protocols.protocol``) and ``COMMANDS`` here.
Settings are layered as KVPress's evaluation layers them: each option's default < a YAML file given with
``--config`` (``evaluation.cli.config_file``: the same flags' types check it) < the command line. Every number is
range-checked here, before any data or model is loaded.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from evaluation.catalogue.specs import canonical
from evaluation.cli.config_file import with_config
from evaluation.cli.named_once import named_once
from evaluation.errors import EvaluationError, refused_write
from evaluation.protocols.loop import output_line, run
from evaluation.protocols.options import MAX_RESAMPLES, whole
from evaluation.protocols.protocol import REFERENCE, Protocol
from evaluation.protocols.shipped import protocols
from evaluation.reporting import DEFAULT_RESAMPLES, DEFAULT_SEED
from evaluation.reporting.rescoring import Rescoring
from evaluation.runs.backends import Backend
from evaluation.runs.files import COMMITTED_FLAG, refuse_committed
from evaluation.runs.models import SMOLLM2_ALIAS, ModelSettings, refuse_remote_code
from evaluation.runs.numerics import machine_threads
from evaluation.runs.record import refuse_unclean
from evaluation.runs.terminal import quiet_libraries

DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION = ("sdpa", "eager", "flash_attention_2")
SCRATCH = Path("scratch")  # git-ignored: only the committed make targets write under results/
INTERRUPTED = "interrupted: every finished cell is saved; run the same command to resume"


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
    parser.add_argument(
        "--threads",
        type=whole(1),
        help=f"intra-op threads of every process that computes the run (default this machine's cores, "
        f"{machine_threads()} here); recorded, since a float's last bits depend on it",
    )


def add_committed_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        COMMITTED_FLAG,
        action="store_true",
        help="let --output be a committed folder under results/ (the Makefile's committed targets pass it)",
    )


def add_protocol(subparsers: argparse._SubParsersAction, protocol: Protocol) -> None:
    """A protocol's subcommand: the options every protocol shares (config file, model, presses unless it takes
    none, where results go, where they run), then its own."""
    parser = subparsers.add_parser(protocol.name, help=protocol.help, description=protocol.description)
    parser.set_defaults(protocol=protocol)
    parser.add_argument("--config", type=Path, help="a YAML file of option values, below the command line")
    add_model_options(parser)
    if protocol.presses is not None:
        presses = list(protocol.presses)
        parser.add_argument(
            "--presses",
            nargs="+",
            type=canonical,
            default=presses,
            help=f"press specs (default {' '.join(presses)}): a name, name(param=value, ...), a wrapper "
            "such as adakv(snapkv), or package.module:Class(...); see evaluation/catalogue/specs.py",
        )
        parser.add_argument(
            "--allow-import", action="store_true", help="let press specs import package.module:Class (runs the module)"
        )
    parser.add_argument("--output", type=Path, help=f"run folder (default {SCRATCH}/{protocol.name}/<model>)")
    add_committed_option(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the grid and its work, load no model")
    parser.add_argument("--backend", choices=["local", "ray"], default="local", help="local (default) or ray")
    parser.add_argument("--ray-address", help="Ray cluster to join (default: start a local Ray instance)")
    parser.add_argument(
        "--workers", type=whole(1), help="Ray workers, each loading the model once (default: one per GPU)"
    )
    parser.add_argument("--retries", type=whole(0), default=2, help="retries of a failed unit on Ray (default 2)")
    protocol.add_options(parser)


def model_settings(args: argparse.Namespace) -> ModelSettings:
    """The model of a protocol's parsed options."""
    threads = args.threads or machine_threads()
    return ModelSettings(args.model, args.dtype, args.attn_implementation, args.device, args.device_map, threads)


def run_protocol(args: argparse.Namespace) -> int:
    """A protocol run (or its dry run) from parsed options."""
    from evaluation.protocols import shipped_work  # noqa: F401 (each protocol's work: torch, KVPress, on a run)

    protocol: Protocol = args.protocol
    named_once(args)
    model = model_settings(args)
    if args.dry_run:  # a dry run plans a GPU machine's run on any machine, so it checks no device
        refuse_remote_code(model.name)
    else:  # a Ray driver plans its workers'
        model.check(here=args.backend == "local")
    output = args.output or SCRATCH / protocol.name / Path(args.model).name
    backend = Backend(args.backend, args.ray_address, args.workers, args.retries)
    config = protocol.configure(args, model, output)
    if args.dry_run:
        print(protocol.dry_run(config))
        print(output_line(protocol, config))
        return 0
    print(f"scorecard: {run(protocol, config, backend) / 'scorecard.md'}")
    return 0


@dataclass(frozen=True)
class Command:
    """A subcommand that is not a protocol: its options, and ``run``, the ``module:function`` that does it (an exit
    status), imported when the command runs: the reporting stack (pandas, matplotlib) stays out of ``--help``."""

    name: str
    help: str
    description: str
    add_options: Callable[[argparse.ArgumentParser], None]
    run: str

    def __call__(self, args: argparse.Namespace) -> int:
        module, _, function = self.run.partition(":")
        return getattr(importlib.import_module(module), function)(args)


def add_scorecard_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=Path, help="run folders holding predictions.jsonl")
    parser.add_argument(
        "--output",
        type=Path,
        default=SCRATCH / "scorecard" / "combined",
        help=f"folder (default {SCRATCH}/scorecard/combined)",
    )
    add_committed_option(parser)
    parser.add_argument(
        "--reference", default=REFERENCE, help=f"the press every other press is compared with (default {REFERENCE})"
    )
    parser.add_argument(
        "--resamples",
        type=whole(1, MAX_RESAMPLES),
        default=DEFAULT_RESAMPLES,
        help=f"bootstrap resamples ({DEFAULT_RESAMPLES})",
    )
    parser.add_argument("--seed", type=whole(0), default=DEFAULT_SEED, help=f"bootstrap seed ({DEFAULT_SEED})")


def add_score_options(parser: argparse.ArgumentParser) -> None:
    """The score command's options: a protocol that rescores (its ``rescoring``) and a file of its predictions."""
    rescorings = rescoring_protocols()
    parser.add_argument("benchmark", choices=list(rescorings))
    lines = ", ".join(f"{name}: {rescoring.fields}" for name, rescoring in rescorings.items())
    parser.add_argument("file", type=Path, help=f"JSONL; {lines} per line")
    parser.add_argument("--per-row", action="store_true", help='add a "rows" list of per-line scores in file order')
    parser.set_defaults(rescorings=rescorings)


def rescoring_protocols() -> dict[str, Rescoring]:
    """The rescoring of every protocol whose predictions the score command rescores, by name."""
    return {name: protocol.rescoring for name, protocol in protocols().items() if protocol.rescoring}


def add_reproduce_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN[:K]",
        help="run folders holding run.json and predictions.jsonl; RUN:K re-runs K units (or steps) of that run",
    )
    parser.add_argument(
        "--sample",
        type=whole(1),
        default=1,
        help="units re-run per run without :K (default 1); where a protocol's unit splits into steps (a streamed "
        "question, a probe, a trace's replay), steps",
    )
    parser.add_argument(
        "--allow-import", action="store_true", help="import the modules the runs' press specs name (runs them)"
    )


COMMANDS = (
    Command(
        "scorecard",
        "one scorecard across LongBench, LoCoMo and trace runs, with bootstrap intervals and win/tie/loss",
        "Read any mix of LongBench, LoCoMo and trace run folders and write OUTPUT/scorecard.{md,csv} and forest.png: "
        "per (condition, budget, press) the mean with a 95%% bootstrap interval over examples, and against the "
        "reference press the paired difference with its interval and a verdict (win, tie when the interval "
        "contains 0, loss).",
        add_scorecard_options,
        "evaluation.reporting.combined:command",
    ),
    Command(
        "score",
        "rescore a JSONL file of predictions with the official metrics",
        "Score a JSONL file of predictions with a benchmark's official metric and print the scores as JSON.",
        add_score_options,
        "evaluation.reporting.rescore:command",
    ),
    Command(
        "reproduce",
        "re-run a sample of committed runs from their run.json and check their rows",
        "Rebuild each run's configuration from its run.json, re-run a sample of its units (the cheapest by the "
        "run's unit seconds; a prefix of steps where a unit splits into steps) into a temporary folder, and compare "
        "every row with the committed row of its key, at the run's recorded thread count: text byte for byte, floats "
        "within their field's measured tolerance (docs/reliability.md). One line per run; "
        "exit status 1 when one differs, 2 for a folder it cannot reproduce.",
        add_reproduce_options,
        "evaluation.cli.reproduce:command",
    ),
)


def parser_for_every_command() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m evaluation", description=__doc__, allow_abbrev=False)
    subparsers = parser.add_subparsers(dest="command", required=True)
    known = protocols()
    for protocol in known.values():
        add_protocol(subparsers, protocol)
    benchmarks = {name: p.benchmark for name, p in known.items()}
    pooled = {name: p.scores_settings() for name, p in known.items()}
    for command in COMMANDS:
        subparser = subparsers.add_parser(command.name, help=command.help, description=command.description)
        command.add_options(subparser)
        subparser.set_defaults(act=command, benchmarks=benchmarks, pooled=pooled)
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
        for flag in ("--output", "--export"):  # what a command writes where the user says
            written = getattr(args, flag.removeprefix("--"), None)
            if written is not None:
                refuse_committed(Path(written), args.committed, flag)
                if args.committed and not getattr(args, "dry_run", False):
                    refuse_unclean(Path(written), flag)
        quiet_libraries()
        return args.act(args) if hasattr(args, "act") else run_protocol(args)
    except EvaluationError as error:  # one line, whatever a message quotes (an inner error's text may hold several)
        print(f"error: {'; '.join(line.strip() for line in str(error).splitlines() if line.strip())}", file=sys.stderr)
        return 2
    except OSError as error:
        if refused_write(error) is None:
            raise
        print(f"error: {refused_write(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 130
