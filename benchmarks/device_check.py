"""A device check: every path the paper's runs take, end to end through the command line, in minutes.

Each check is one ``python -m evaluation`` run in a fresh process, on a model that needs no hub (SmolLM2 by
default):

- ``longbench-shared``: the shared prefill, every default press (teacher-forced RMM on the stored inputs), bf16;
- ``longbench-per-cell``: KVPress's prefill under each press, with teacher-forced RMM and eager H2O, bf16;
- ``longbench-fp16``: the shared path in float16;
- ``longbench-device-map``: the shared path with ``--device-map auto`` (accelerate's placement);
- ``longbench-ray``: the shared path on a Ray worker (one GPU where the device is a GPU);
- ``locomo``: a LoCoMo stream with every default press (rmm among them), bf16;
- ``long-prefill``: one ``--long-length``-token multi-query document (16k by default, past SmolLM2's 8k
  training length) through the streaming engine's chunked scorer, bf16;
- ``*-flash``: the shared LongBench path and LoCoMo again with flash_attention_2, where flash-attn and a CUDA
  device exist.

A check fails when its process exits non-zero or when any row it wrote carries an error. Everything lands under
``--output``: one run folder per check, and ``summary.json`` with each check's wall time, peak memory (CUDA's
peak allocated bytes on a GPU, the process's peak RSS on a CPU), rows and error rows. The script exits 1 when
any check failed. The defaults are sized for under 8 minutes on one GPU (no GPU has run them yet: none has been
lent to this project); ``tests/test_device_check.py`` runs the same checks on this CPU at reduced sizes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

from evaluation.runs.data_location import shared_data

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, resource, sys
import torch
from evaluation.cli.main import main

code = main(sys.argv[1:])
if torch.cuda.is_available():
    peak, kind = torch.cuda.max_memory_allocated(), "cuda max_memory_allocated"
else:
    peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "cpu max RSS"
print("DEVICE_CHECK " + json.dumps({"exit": code, "peak_memory_bytes": peak, "peak_memory": kind}))
sys.exit(code)
"""


def flash_available(device: str) -> bool:
    return device.startswith("cuda") and importlib.util.find_spec("flash_attn") is not None


def presses(args: argparse.Namespace, default: list[str]) -> list[str]:
    chosen = args.presses or default
    return ["--presses", *chosen] if chosen else []


def checks(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each check's command line (without --output)."""
    data = args.data
    common = ["--model", args.model, "--device", args.device]
    longbench = ["longbench", "--data", str(data / "longbench"), "--max-length", str(args.max_length), *common]
    locomo = ["locomo", "--data", str(data / "locomo" / "locomo10.json"), "--conversations", args.conversation]
    locomo += ["--max-turns", str(args.questions), "--placement", "evidence", "--budgets", "512", *common]
    bf16 = ["--dtype", "bfloat16"]
    grid = presses(args, [])
    runs = {
        "longbench-shared": [*longbench, "--n", str(args.n), *bf16, *grid],
        "longbench-per-cell": [*longbench, "--n", "1", "--path", "per-cell", *bf16, *grid],
        "longbench-fp16": [*longbench, "--n", "1", "--dtype", "float16", *grid],
        "longbench-device-map": [*longbench, "--n", "1", "--device-map", "auto", *bf16, *grid],
        "longbench-ray": [*longbench, "--n", "1", "--backend", "ray", "--workers", "1", *bf16, *grid],
        "locomo": [*locomo, *bf16, *grid],
        "long-prefill": [
            "multiquery",
            *common,
            *bf16,
            "--lengths",
            str(args.long_length),
            "--episodes",
            "1",
            "--max-turns",
            "1",
            "--budgets",
            "1024",
            "--max-history-tokens",
            str(args.long_history or args.long_length + 1024),
            *presses(args, ["full", "h2o", "rmm", "snapkv"]),
        ],
    }
    if flash_available(args.device):
        flash = ["--attn-implementation", "flash_attention_2"]
        runs["longbench-shared-flash"] = [*runs["longbench-shared"], *flash]
        runs["locomo-flash"] = [*runs["locomo"], *flash]
    return runs


def error_rows(folder: Path) -> tuple[int, list[str]]:
    """The rows a run wrote, and the first line of each row's error."""
    path = folder / "predictions.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return len(rows), [f"{row.get('press')}: {row['error']}" for row in rows if row.get("error")]


def run_check(name: str, argv: list[str], output: Path) -> dict:
    folder = output / name
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *argv, "--output", str(folder)], cwd=ROOT, capture_output=True, text=True
    )
    seconds = round(time.perf_counter() - start, 1)
    reported = [line for line in done.stdout.splitlines() if line.startswith("DEVICE_CHECK ")]
    measured = json.loads(reported[-1].removeprefix("DEVICE_CHECK ")) if reported else {}
    rows, errors = error_rows(folder)
    failure = None
    if done.returncode:
        failure = (done.stderr.strip().splitlines() or ["no output"])[-1]
    elif not rows:
        failure = "the run wrote no rows"
    elif errors:
        failure = f"{len(errors)} error rows, the first: {errors[0]}"
    return {
        "command": ["python", "-m", "evaluation", *argv],
        "wall_seconds": seconds,
        "peak_memory_bytes": measured.get("peak_memory_bytes"),
        "peak_memory": measured.get("peak_memory"),
        "rows": rows,
        "error_rows": len(errors),
        "passed": failure is None,
        "failure": failure,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--n", type=int, default=2, help="LongBench examples on the shared path (default 2)")
    parser.add_argument("--max-length", type=int, default=2048, help="LongBench prompt tokens (default 2048)")
    parser.add_argument("--questions", type=int, default=6, help="LoCoMo questions (default 6)")
    parser.add_argument("--conversation", default="conv-30")
    parser.add_argument("--long-length", type=int, default=16384, help="the long prefill's tokens (default 16384)")
    parser.add_argument("--long-history", type=int, help="its --max-history-tokens (default: its length + 1024)")
    parser.add_argument("--presses", nargs="+", help="press specs of every check (default: each protocol's own)")
    parser.add_argument("--only", nargs="+", help="run only these checks")
    parser.add_argument(
        "--data", type=Path, default=shared_data(), help="folder holding longbench/ and locomo/ (default: shared/data)"
    )
    parser.add_argument("--output", type=Path, default=ROOT / "results" / "device_check")
    args = parser.parse_args(argv)
    planned = checks(args)
    unknown = sorted(set(args.only or ()) - set(planned))
    if unknown:
        parser.error(f"unknown checks {unknown}: choose from {sorted(planned)}")
    report: dict = {"model": args.model, "device": args.device, "checks": {}}
    start = time.perf_counter()
    for name, command in planned.items():
        if args.only and name not in args.only:
            continue
        result = run_check(name, command, args.output)
        report["checks"][name] = result
        verdict = "passed" if result["passed"] else f"FAILED: {result['failure']}"
        print(f"{name}: {result['wall_seconds']} s, {result['rows']} rows, {verdict}", flush=True)
    report["wall_seconds"] = round(time.perf_counter() - start, 1)
    report["passed"] = all(result["passed"] for result in report["checks"].values())
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    sys.exit(0 if main()["passed"] else 1)
