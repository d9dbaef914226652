"""The GPU check: every path the paper's runs take, in one process and one command, with no hub and no weights file.

It builds Qwen2.5-7B's architecture (28 layers, 28 query and 4 KV heads of 128 dimensions, hidden size 3,584) with
random bfloat16 weights directly on the device, and a byte-level tokenizer built in code (one token per byte), then
drives the protocols through their own API (option parsing, ``plan`` and each unit's ``work``) on offline data
copied into the checkout by ``make gpu-data`` (``gpu_data/``, git-ignored). ``--scale tiny`` builds a 2-layer model
of the same head layout (28 query and 4 KV heads) at reduced lengths, for a CPU.

Phases, in order (answers capped at 16 tokens):

- ``build``: the model and tokenizer;
- ``grid-8k``, ``grid-32k``: LongBench's shared path, every default press and knorm, adakv(snapkv), pyramidkv;
- ``per-cell-16k``: the per-cell path: teacher-forced RMM, eager H2O (KVPress's), TOVA, SnapKV, StreamingLLM;
- ``eager-h2o-32k-refused``: eager H2O at 32k tokens must be refused before it runs (``MemoryRefusal``: the run
  stops and stores nothing for the cell, so a device with the memory runs it on resume);
- ``decoding-press``: KVPress's ``DecodingPress`` around TOVA and around RMM;
- ``locomo-1800``: a LoCoMo stream at a budget of 1,800 tokens, every default press;
- ``likelihood-8k``: the shared grid's answer likelihoods alone (``--likelihood-only``);
- ``fp16-grid-8k``: the shared grid again with the weights in float16.

A phase fails on an exception, a row with an error (other than the expected refusal), an answer over the cap, a
non-finite answer likelihood, or running past its time bound. After every phase the JSON report is rewritten:
``phases``, a list of {name, seconds, peak_bytes, rows, errors}; ``peak_bytes`` is CUDA's peak allocated bytes
during the phase on a GPU and the process's peak resident memory so far on a CPU. The script exits 1 when any
phase failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the checkout's own packages

from evaluation.catalogue.specs import DEFAULT_PRESSES  # noqa: E402
from evaluation.cli.main import parser_for_every_command  # noqa: E402
from evaluation.errors import MemoryRefusal, first_line  # noqa: E402
from evaluation.protocols import shipped_work  # noqa: E402, F401 (registers each protocol's work)
from evaluation.protocols.shipped import protocols  # noqa: E402
from evaluation.runs.models import BYTE_CHAT_TEMPLATE, ModelSettings, byte_tokenizer  # noqa: E402
from evaluation.runs.store import MemoryStore  # noqa: E402
from evaluation.runs.terminal import quiet_libraries  # noqa: E402

DATA = ROOT / "gpu_data"
ANSWER_CAP = 16
GRID = [*DEFAULT_PRESSES, "knorm", "adakv(snapkv)", "pyramidkv"]
PER_CELL = ["rmm", "h2o", "tova", "snapkv", "streaming_llm"]
DECODING = ["decoding(tova)", "decoding(rmm)"]
MODEL_NAME = "qwen2.5-7b-architecture-random"


@dataclass(frozen=True)
class Scale:
    """A model's shape and the lengths its phases run at."""

    layers: int
    hidden: int
    intermediate: int
    head_dim: int
    short: int  # the 8k phases
    middle: int  # the per-cell phase
    long: int  # the 32k grid
    context: int  # the model's positions and the tokenizer's limit
    bound: int  # seconds a phase may take
    questions: int  # LoCoMo questions streamed
    heads: int = 28
    kv_heads: int = 4


SCALES = {
    "7b": Scale(28, 3584, 18944, 128, 8192, 16384, 32768, 34816, 120, 3),
    "tiny": Scale(2, 224, 256, 8, 512, 512, 1024, 34816, 120, 1),  # its context holds the refused phase's prompt
}
REFUSED_LENGTH = 32768  # eager H2O's weights at this length fit neither an H200 (bf16) nor a CPU (float32)


class PhaseTimeout(Exception):
    pass


@dataclass
class PhaseReport:
    name: str
    seconds: float = 0.0
    peak_bytes: int | None = None
    rows: int = 0
    errors: list[str] = field(default_factory=list)


Loaded = tuple[torch.nn.Module, object]


def build_model(scale: Scale, device: str, dtype: torch.dtype) -> Loaded:
    """Qwen2's architecture at ``scale`` with random weights, built on ``device``, and the byte-level tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = byte_tokenizer(BYTE_CHAT_TEMPLATE, scale.context)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=scale.hidden,
        intermediate_size=scale.intermediate,
        num_hidden_layers=scale.layers,
        num_attention_heads=scale.heads,
        num_key_value_heads=scale.kv_heads,
        head_dim=scale.head_dim,
        max_position_embeddings=scale.context,
        rope_theta=1e6,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM._from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval(), tokenizer


def capped(work: partial, tokens: int) -> partial:
    """A LongBench plan's work with each task's answer length capped at ``tokens``."""
    task_configs = {
        task: replace(c, max_new_tokens=min(c.max_new_tokens, tokens))
        for task, c in work.keywords["task_configs"].items()
    }
    return partial(work.func, *work.args, **{**work.keywords, "task_configs": task_configs})


def run_protocol(loaded: Loaded, argv: list[str], model: ModelSettings, answer_cap: int = ANSWER_CAP) -> list[dict]:
    """One protocol's rows for ``argv`` (its command line after ``python -m evaluation``, less the model options),
    on the model already built, described by ``model``; LongBench's answers capped at ``answer_cap`` tokens."""
    args = parser_for_every_command().parse_args(argv)
    protocol = protocols()[args.protocol.name]
    config = protocol.configure(args, model, ROOT / "scratch" / "gpu_check")
    plan = protocol.plan(config)
    work = capped(plan.work, answer_cap) if "task_configs" in getattr(plan.work, "keywords", {}) else plan.work
    store = MemoryStore(protocol.row_key, [])
    for unit in plan.units:
        work(loaded, unit, store)
    return store.rows


def row_errors(rows: list[dict], refusal_expected: bool = False) -> list[str]:
    """What is wrong with a phase's rows."""
    errors = []
    for row in rows:
        where = f"{row.get('press')} @ {row.get('budget_label', row.get('budget'))}"
        if row.get("error"):
            errors.append(f"{where}: {row['error']}")
        if row.get("generated_tokens", 0) > ANSWER_CAP:
            errors.append(f"{where}: {row['generated_tokens']} answer tokens, over the cap of {ANSWER_CAP}")
        nll = row.get("answer_nll")
        if nll is not None and not math.isfinite(nll):
            errors.append(f"{where}: answer likelihood {nll}")
    if refusal_expected and not any(row.get("refused") for row in rows):
        errors.append("eager H2O was not refused before it ran")
    if not rows:
        errors.append("the phase wrote no rows")
    return errors


@contextmanager
def bounded(seconds: int) -> Iterator[None]:
    """Raise ``PhaseTimeout`` in the main thread once ``seconds`` have passed."""

    def stop(signum, frame):
        raise PhaseTimeout(f"ran past its bound of {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def peak_bytes(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass(frozen=True)
class Phase:
    """A phase: its name, what it runs on the loaded model (its rows), and whether a refusal is its result."""

    name: str
    run: Callable[[Loaded], list[dict]]
    refusal: bool = False


def phases(scale: Scale, device: str, data: Path) -> list[Phase]:
    longbench = ["longbench", "--data", str(data / "longbench"), "--n", "1"]
    locomo = ["locomo", "--data", str(data / "locomo" / "locomo10.json"), "--placement", "evidence"]
    locomo += ["--max-turns", str(scale.questions), "--budgets", "1800", "--max-new-tokens", str(ANSWER_CAP)]
    bf16 = ModelSettings(MODEL_NAME, "bfloat16", "sdpa", device)

    def grid(length: int, dtype: str = "bfloat16", *extra: str) -> Callable[[Loaded], list[dict]]:
        argv = [*longbench, "--max-length", str(length), "--presses", *GRID, *extra]
        return lambda loaded: run_protocol(loaded, argv, ModelSettings(MODEL_NAME, dtype, "sdpa", device))

    def per_cell(length: int, presses: list[str]) -> Callable[[Loaded], list[dict]]:
        argv = [*longbench, "--max-length", str(length), "--path", "per-cell", "--ratios", "0.5", "--presses", *presses]
        return lambda loaded: run_protocol(loaded, argv, bf16)

    def refused(run: Callable[[Loaded], list[dict]]) -> Callable[[Loaded], list[dict]]:
        """``run``, whose eager cell must be refused for its memory before it runs: the refusal as its one row."""

        def expect(loaded: Loaded) -> list[dict]:
            try:
                return run(loaded)
            except MemoryRefusal as refusal:
                return [{"press": "h2o", "refused": first_line(refusal)}]

        return expect

    def in_float16(loaded: Loaded) -> list[dict]:
        loaded[0].to(torch.float16)
        return grid(scale.short, "float16")(loaded)

    return [
        Phase(f"grid-{scale.short}", grid(scale.short)),
        Phase(f"grid-{scale.long}", grid(scale.long)),
        Phase(f"per-cell-{scale.middle}", per_cell(scale.middle, PER_CELL)),
        Phase(f"eager-h2o-{REFUSED_LENGTH}-refused", refused(per_cell(REFUSED_LENGTH, ["h2o"])), refusal=True),
        Phase("decoding-press", per_cell(scale.short, DECODING)),
        Phase("locomo-1800", lambda loaded: run_protocol(loaded, locomo, bf16)),
        Phase(f"likelihood-{scale.short}", grid(scale.short, "bfloat16", "--likelihood-only")),
        Phase(f"fp16-grid-{scale.short}", in_float16),
    ]


@contextmanager
def measured(report: PhaseReport, device: str, bound: int) -> Iterator[None]:
    """Time ``report``'s phase, bound it to ``bound`` seconds, record its peak memory and any exception."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    try:
        with bounded(bound):
            yield
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
    except Exception as error:  # a phase's failure is its report's, and the next phase still runs
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        report.errors.append(f"{type(error).__name__}: {reason}")
    report.seconds = round(time.perf_counter() - start, 2)
    report.peak_bytes = peak_bytes(device)


def check_input(args: argparse.Namespace) -> str | None:
    """What is wrong with the command, in one line, before any work."""
    needed = [args.data / "longbench" / "multi_news.jsonl", args.data / "locomo" / "locomo10.json"]
    missing = [str(path) for path in needed if not path.is_file()]
    if missing:
        return f"missing {', '.join(missing)}: run `make gpu-data` (copies a slice of the shared data into gpu_data/)"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device {args.device}: this machine has no CUDA device; use --device cpu with --scale tiny"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="7b", help="7b (default) or tiny (a CPU's)")
    parser.add_argument("--device", default="cuda", help="torch device (default cuda)")
    parser.add_argument("--data", type=Path, default=DATA, help="folder holding longbench/ and locomo/ (gpu_data)")
    parser.add_argument("--output", type=Path, required=True, help="the JSON report, rewritten after every phase")
    args = parser.parse_args(argv)
    problem = check_input(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    quiet_libraries()
    scale = SCALES[args.scale]
    report = {"scale": args.scale, "device": args.device, "scale_settings": asdict(scale), "phases": []}
    args.output.parent.mkdir(parents=True, exist_ok=True)

    def record(phase: PhaseReport) -> None:
        report["phases"].append(asdict(phase))
        report["passed"] = all(not p["errors"] for p in report["phases"])
        args.output.write_text(json.dumps(report, indent=2) + "\n")
        verdict = "ok" if not phase.errors else f"FAILED: {phase.errors[0]}"
        print(f"{phase.name}: {phase.seconds} s, {phase.rows} rows, {verdict}", flush=True)

    build = PhaseReport("build")
    with measured(build, args.device, scale.bound):
        loaded = build_model(scale, args.device, torch.bfloat16)
    record(build)
    for phase in phases(scale, args.device, args.data) if not build.errors else []:
        done = PhaseReport(phase.name)
        with measured(done, args.device, scale.bound):
            rows = phase.run(loaded)
            done.rows, done.errors = len(rows), row_errors(rows, phase.refusal)
        record(done)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
