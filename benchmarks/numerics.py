"""How far a committed run's floats move with the intra-op thread count: the bound behind ``reproduce``'s tolerances
(``evaluation.cli.reproduce.TOLERANCES``, docs/reliability.md "Numerics").

For each ``RUN[:K]`` (default the perplexity and LongBench samples that ``make reproduce`` re-runs), the sample
``reproduce`` would take is re-run once per ``--threads`` count (default 1 and 2), each in this one process with its
count set before the model loads, ``--repeats`` times each; every float field of every re-run row is compared with
the committed row and with every other re-run, and the largest difference per field is kept (a list's, such as
``nll_by_position``, over its items). Text is compared byte for byte (a differing text is reported, not bounded).
Prints and writes (after each run), per run, the largest difference per field over all those pairs, and whether two
runs at one count ever differed at all.

Run it with nothing else on the machine or beside other work alike: at a fixed count the load changes only the time
(the repeats say whether that held here).

Writes ``results/bench/numerics.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
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
RUNS = ("results/perplexity/smollm2-135m:1", "results/longbench/smollm2-135m:1")


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
    elif isinstance(a, float) and isinstance(b, float):
        gap = 0.0 if a == b or (math.isnan(a) and math.isnan(b)) else abs(a - b)
        found[field] = max(found.get(field, 0.0), gap)
    elif a != b or type(a) is not type(b):
        texts.append(f"{field}: {a!r} vs {b!r}"[:200])


def compare(first: dict, second: dict) -> tuple[dict[str, float], list[str]]:
    found: dict[str, float] = {}
    texts: list[str] = []
    for key, row in first.items():
        for field in dict.fromkeys([*row, *second[key]]):
            differences(row.get(field), second[key].get(field), field, found, texts)
    return found, texts


def largest(*found: dict[str, float]) -> dict[str, float]:
    fields = sorted({field for f in found for field in f})
    return {field: max(f.get(field, 0.0) for f in found) for field in fields}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", default=list(RUNS), help=f"RUN[:K] (default {' '.join(RUNS)})")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="thread counts (default 1 2)")
    parser.add_argument("--repeats", type=int, default=1, help="re-runs per count (default 1)")
    parser.add_argument("--output", type=Path, default=ROOT / "results/bench/numerics.json")
    args = parser.parse_args()
    report: dict = {"machine_threads": machine_threads(), "threads": args.threads, "repeats": args.repeats, "runs": {}}
    for text in args.runs:
        committed, reruns = {}, []
        for threads in args.threads:
            for repeat in range(args.repeats):
                with tempfile.TemporaryDirectory(prefix="numerics-") as scratch:
                    committed, rows = rerun(text, threads, Path(scratch))
                reruns.append((threads, repeat, rows))
                print(f"{text}: re-run at {threads} threads ({repeat + 1} of {args.repeats}): {len(rows)} rows")
        against_committed = {f"{t} threads": compare(committed, rows) for t, _, rows in reruns}
        pairs = {f"{t}/{r} vs {u}/{s}": compare(a, b) for (t, r, a), (u, s, b) in combinations(reruns, 2)}
        same_count = [found for (t, _, _), (u, _, _), found in (
            (x, y, compare(x[2], y[2])[0]) for x, y in combinations(reruns, 2)) if t == u]  # fmt: skip
        entry = {
            "rows": len(committed),
            "largest": largest(*(f for f, _ in [*against_committed.values(), *pairs.values()])),
            "against_committed": {name: found for name, (found, _) in against_committed.items()},
            "between_reruns": {name: found for name, (found, _) in pairs.items()},
            "same_count_moved": any(value > 0 for found in same_count for value in found.values()),
            "texts_differ": sorted({t for _, texts in [*against_committed.values(), *pairs.values()] for t in texts}),
        }
        report["runs"][text] = entry
        print(json.dumps({text: entry["largest"], "texts_differ": entry["texts_differ"]}, indent=2))
        write_report(args.output, report)  # after each run: a stopped measurement keeps the runs it finished


if __name__ == "__main__":
    main()
