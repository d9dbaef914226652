"""The README's first commands timed as a new user runs them: a fresh clone of this checkout's HEAD, ``make setup``,
the offline default model's one-time conversion, then ``make eval-longbench`` and ``make eval-locomo``, each timed
(wall, and its processes' user and system CPU seconds) with the load average before it, into
``results/bench/first_commands.json`` (the README quotes it).

The README's times hold on a quiet machine: run it with nothing else running (the load averages it records say
whether that held). ``--cache`` keeps the user's converted model (``KVET_CACHE``) instead of a fresh one, so the
conversion step then costs nothing; the clone is removed afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import write_report

ROOT = Path(__file__).resolve().parents[1]
CONVERT = "from evaluation.runs.models import resolve_model_path; resolve_model_path('smollm2-135m')"
RUNS = ("make eval-longbench", "make eval-locomo")


def timed(command: list[str], folder: Path, environment: dict[str, str]) -> dict:
    """Run ``command`` in ``folder`` and return its wall and CPU seconds and the load average before it."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run(command, cwd=folder, env=environment, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "command": " ".join(command),
        "wall_seconds": round(wall, 1),
        "user_seconds": round(after.ru_utime - before.ru_utime, 1),
        "sys_seconds": round(after.ru_stime - before.ru_stime, 1),
        "load_average_before": round(load, 2),
    }


def shared_data() -> Path:
    """This checkout's shared data, by the one rule (``evaluation.runs.data_location``)."""
    inside = ROOT / "shared" / "data"
    return inside if inside.is_dir() else ROOT.parent / "shared" / "data"


def fresh_clone(target: Path) -> str:
    """A clone of this checkout's HEAD in ``target``; its commit."""
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(target)], check=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=target, capture_output=True, text=True)
    return commit.stdout.strip()


def measure(work: Path, environment: dict[str, str], make_args: list[str]) -> dict:
    clone = work / "clone"
    commit = fresh_clone(clone)
    setup = timed(["make", "setup", *make_args], clone, environment)
    conversion = timed([str(clone / ".venv" / "bin" / "python"), "-c", CONVERT], clone, environment)
    runs = [timed(command.split(), clone, environment) for command in RUNS]
    return {"commit": commit, "setup": setup, "conversion": conversion, "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=ROOT / "results" / "bench" / "first_commands.json")
    parser.add_argument("--cache", action="store_true", help="keep KVET_CACHE (the converted model) as it is")
    parser.add_argument("--keep", action="store_true", help="keep the clone (printed)")
    parser.add_argument("--make-args", nargs="*", default=[], help="passed to make setup, e.g. TORCH_INDEX=...")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="first-commands-"))
    environment = {"KVET_SHARED_DATA": str(shared_data()), **os.environ}  # the clone sits beside no shared/data
    if not args.cache:
        environment["KVET_CACHE"] = str(work / "cache")
    try:
        measured = measure(work, environment, args.make_args)
    finally:
        if args.keep:
            print(f"clone kept: {work / 'clone'}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    quiet = all(step["load_average_before"] < 0.5 for step in [measured["setup"], *measured["runs"]])
    report = {
        "what": "README's first commands timed on a fresh clone (make setup, the default model's one-time "
        f"conversion{' (already cached)' if args.cache else ''}, then each run), on {os.cpu_count()} CPU cores, "
        f"{'with nothing else running' if quiet else 'NOT quiet: another load ran (see load_average_before)'}",
        "cores": os.cpu_count(),
        "shared_data": environment["KVET_SHARED_DATA"],
        **measured,
    }
    print(json.dumps(write_report(args.output, report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
