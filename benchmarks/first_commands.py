"""The README's first commands timed as a new user runs them: a fresh clone of this checkout's HEAD, ``make setup``,
the offline default model's one-time conversion, then ``make eval-longbench`` and ``make eval-locomo``, each timed
(wall, and its processes' user and system CPU seconds) with the load average before it, into
``results/bench/first_commands.json`` (the README quotes it).

The README's times hold on a quiet machine: run it with nothing else running (the load averages it records say
whether that held). The report states each condition: the cores, the platform and Python, the load average before
each step, pip's cache before ``make setup`` (warm from 500 MB: its wheels are not downloaded again), whether the
model's conversion was cached, the shared data, and each run's plan (what it ran) from its progress. ``--cache``
keeps the user's converted model (``KVET_CACHE``) instead of a fresh one, so the conversion step then costs nothing;
the clone is removed afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
QUIET = 0.5  # the largest load average before a step at which the machine counts as quiet
SETTLE_SECONDS = 600  # the longest wait for the load a step leaves behind to settle before the next one
WARM_MEGABYTES = 500  # pip's cache holding the stack's wheels (torch alone is about 200 MB on CPU)


def settled() -> float:
    """Seconds waited (at most ``SETTLE_SECONDS``) for the one-minute load average to fall below ``QUIET``: the load
    a step leaves behind decays over about a minute, and would otherwise count as another load on the next step."""
    started = time.monotonic()
    while os.getloadavg()[0] >= QUIET and time.monotonic() - started < SETTLE_SECONDS:
        time.sleep(5)
    return round(time.monotonic() - started, 1)


def timed(command: list[str], folder: Path, environment: dict[str, str]) -> dict:
    """Run ``command`` in ``folder``, once the load has settled, and return its wall and CPU seconds, the wait and
    the load average before it and, for a harness run, the plan its progress states first (what was run: examples,
    cells, tokens to decode)."""
    waited = settled()
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(command, cwd=folder, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stderr = done.stderr.decode(errors="replace")
    if done.returncode:
        sys.stderr.write(stderr)
        raise subprocess.CalledProcessError(done.returncode, command)
    plan = next((line.split("plan: ", 1)[1] for line in stderr.splitlines() if "plan: " in line), None)
    return {
        "command": " ".join(command),
        "wall_seconds": round(wall, 1),
        "user_seconds": round(after.ru_utime - before.ru_utime, 1),
        "sys_seconds": round(after.ru_stime - before.ru_stime, 1),
        "settle_seconds": waited,
        "load_average_before": round(load, 2),
        **({"plan": plan} if plan else {}),
    }


def pip_cache() -> dict:
    """pip's cache before ``make setup`` (its folder and size): a warm cache installs without downloading."""
    found = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    folder = Path(found.stdout.strip()) if found.returncode == 0 else None
    if folder is None or not folder.is_dir():
        return {"folder": None, "megabytes": 0}
    size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    return {"folder": str(folder), "megabytes": round(size / 2**20)}


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
    cache = pip_cache()
    setup = {**timed(["make", "setup", *make_args], clone, environment), "pip_cache_before": cache}
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
    steps = [measured["setup"], measured["conversion"], *measured["runs"]]
    quiet = all(step["load_average_before"] < QUIET for step in steps)
    megabytes = measured["setup"]["pip_cache_before"]["megabytes"]
    report = {
        "what": "README's first commands timed on a fresh clone (make setup, the default model's one-time "
        f"conversion{' (already cached)' if args.cache else ''}, then each run, timed after both), on "
        f"{os.cpu_count()} CPU cores, "
        f"{'with nothing else running' if quiet else 'NOT quiet: another load ran (see load_average_before)'}, "
        f"pip's cache {'warm' if megabytes >= WARM_MEGABYTES else 'cold'} ({megabytes} MB before make setup)",
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "shared_data": environment["KVET_SHARED_DATA"],
        **measured,
    }
    print(json.dumps(write_report(args.output, report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
