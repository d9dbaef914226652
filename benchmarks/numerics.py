"""How far a committed run's floats move with the intra-op thread count: the bound behind ``reproduce``'s tolerances
(``evaluation.cli.reproduce.TOLERANCES``, docs/reliability.md "Numerics").

For each ``RUN[:K]`` (default one committed run of each protocol that ``make reproduce`` re-runs, one unit or step
each: every float field a reproduction compares, the perplexity cell's ``nll`` and ``nll_by_position``, LongBench's
and the streamed protocols' ``answer_nll``, the probe's confidence, a trace's attention shares), the sample
``reproduce`` would take is re-run once per ``--threads`` count (default 1, 2 and this machine's cores; a count named
twice runs twice, so on a 2-core machine 2 is repeated), each in this one process with its count set before the
model loads. Every float field of every re-run row is compared with the committed row and with every other re-run,
and the largest difference per field is kept (a list's, such as ``nll_by_position``, over its items). Text is
compared byte for byte (a differing text is reported, not bounded). Prints and writes (after each run), per run and
over all runs, the largest difference per field, whether two re-runs at one count ever differed, and each re-run's
seconds (wall and CPU).

Run it with nothing else on the machine or beside other work alike: at a fixed count the load changes only the time
(the repeated count says whether that held here).

Writes ``results/bench/numerics.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import replace
from itertools import combinations
from pathlib import Path

from evaluation.runs.numerics import machine_threads, runtime_environment

runtime_environment()  # as python -m evaluation sets it, before torch loads

from report import write_report  # noqa: E402

from evaluation.cli.reproduce import LOCAL, SampleStore, committed_row, prepare, requested, stopping  # noqa: E402
from evaluation.protocols.protocol import lacks  # noqa: E402
from evaluation.runs.backends import run_units  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNS = tuple(
    f"results/{run}:1"
    for run in (
        "perplexity/smollm2-135m",
        "longbench/smollm2-135m",
        "locomo/smollm2-135m",
        "reuse/smollm2-135m",
        "multiquery/smollm2-135m",
        "memory/smollm2-135m",
        "traces/smollm2-135m",
        "probe/smollm2-135m",
        "ruler/smollm2-135m",
        "needle/smollm2-135m",
    )
)


def rerun(text: str, threads: int, scratch: Path) -> tuple[dict, dict]:
    """The committed rows of ``text``'s sample and its rows re-run at ``threads``, both by row key."""
    folder, size = requested(text, 1)
    prepared = prepare(ROOT / folder, size, scratch)
    if isinstance(prepared, str):
        raise SystemExit(prepared)
    config = replace(prepared.config, model=replace(prepared.config.model, threads=threads))
    store = SampleStore(scratch / "predictions.jsonl", prepared.protocol.row_key)
    partial_units = {s.unit.name: s.unit.keys for s in prepared.sample if s.steps < s.of}
    incomplete = lambda row: lacks(row, prepared.protocol.likelihood)  # noqa: E731
    run_units([s.unit for s in prepared.sample], stopping(prepared.plan.work, partial_units), config.model, store,
              LOCAL, incomplete)  # fmt: skip
    rows = {prepared.protocol.row_key(row): row for row in store.rows}
    return {key: committed_row(prepared, key, row) for key, row in rows.items()}, rows


def differences(a: object, b: object, field: str, found: dict[str, float], texts: list[str]) -> None:
    """The largest float difference between ``a`` and ``b`` per field into ``found``; a differing non-float into
    ``texts``."""
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for x, y in zip(a, b, strict=True):
            differences(x, y, field, found, texts)
    elif isinstance(a, dict) and isinstance(b, dict) and list(a) == list(b):
        for name in a:
            differences(a[name], b[name], field, found, texts)
    elif isinstance(a, float) and isinstance(b, float):
        gap = 0.0 if a == b or (math.isnan(a) and math.isnan(b)) else abs(a - b)
        found[field] = max(found.get(field, 0.0), gap)
    elif a != b or type(a) is not type(b):
        texts.append(f"{field}: {a!r} vs {b!r}"[:200])


def compare(first: dict, second: dict) -> tuple[dict[str, float], list[str]]:
    """The largest float difference per field between two sets of rows by key, and the non-floats that differ."""
    found: dict[str, float] = {}
    texts: list[str] = []
    for key, row in first.items():
        for field in dict.fromkeys([*row, *second[key]]):
            differences(row.get(field), second[key].get(field), field, found, texts)
    return found, texts


def largest(found: list[dict[str, float]]) -> dict[str, float]:
    fields = sorted({field for f in found for field in f})
    return {field: max(f.get(field, 0.0) for f in found) for field in fields}


def measured(text: str, counts: list[int]) -> dict:
    """``text``'s sample re-run at each of ``counts``: the largest difference per field against the committed rows
    and between re-runs, the texts that differ, and each re-run's seconds (wall, and CPU: this process's threads
    together, which the machine's load changes less)."""
    committed: dict = {}
    reruns: list[tuple[int, str, dict]] = []
    seconds: dict[str, dict[str, float]] = {}
    for index, threads in enumerate(counts):
        again = counts.count(threads) > 1
        name = f"{threads} threads" + (f", run {counts[: index + 1].count(threads)}" if again else "")
        start, processor = time.perf_counter(), time.process_time()
        with tempfile.TemporaryDirectory(prefix="numerics-") as scratch:
            committed, rows = rerun(text, threads, Path(scratch))
        seconds[name] = {
            "wall": round(time.perf_counter() - start, 1),
            "cpu": round(time.process_time() - processor, 1),
        }
        reruns.append((threads, name, rows))
        print(f"{text}: re-run at {name}: {len(rows)} rows, seconds {seconds[name]}", flush=True)
    against = {name: compare(committed, rows) for _, name, rows in reruns}
    pairs = [(a == b, f"{x} vs {y}", compare(one, other)) for (a, x, one), (b, y, other) in combinations(reruns, 2)]
    between = {name: found for _, name, found in pairs}
    same_count = [found for same, _, (found, _) in pairs if same]
    return {
        "rows": len(committed),
        "largest": largest([found for found, _ in [*against.values(), *between.values()]]),
        "against_committed": {name: found for name, (found, _) in against.items()},
        "between_reruns": {name: found for name, (found, _) in between.items()},
        "same_count_moved": any(value > 0 for found in same_count for value in found.values()),
        "texts_differ": sorted({t for _, texts in [*against.values(), *between.values()] for t in texts}),
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", default=list(RUNS), help="RUN[:K] (default: one run of each protocol, K=1)")
    parser.add_argument(
        "--threads",
        nargs="+",
        type=int,
        default=[1, 2, machine_threads()],
        help=f"thread counts, a count named twice run twice (default 1 2 {machine_threads()})",
    )
    parser.add_argument("--output", type=Path, default=ROOT / "results/bench/numerics.json")
    args = parser.parse_args()
    start = time.perf_counter()
    report: dict = {"machine_threads": machine_threads(), "threads": args.threads, "largest": {}, "runs": {}}
    for text in args.runs:
        entry = measured(text, args.threads)
        report["runs"][text] = entry
        report["largest"] = largest([run["largest"] for run in report["runs"].values()])
        report["seconds"] = {"wall": round(time.perf_counter() - start, 1), "cpu": round(time.process_time(), 1)}
        print(json.dumps({text: entry["largest"], "texts_differ": entry["texts_differ"]}, indent=2), flush=True)
        write_report(args.output, report)  # after each run: a stopped measurement keeps the runs it finished


if __name__ == "__main__":
    main()
