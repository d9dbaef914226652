"""Attention-reading scores without eager attention: peak memory and time of an H2O-scored prefill.

Four ways to prefill SmolLM2 at each length, side by side in one run, each in a fresh process (peak RSS is a
per-process figure), interleaved repeat by repeat:

- ``sdpa``: no press, sdpa attention (the floor);
- ``h2o``: KVPress's ``ObservedAttentionPress``, which needs eager attention weights;
- ``rmm(correctness='uniform')``: RMM with uniform weights, which keeps exactly what H2O keeps (a test asserts
  it), from column sums recomputed chunk by chunk under sdpa;
- ``rmm(correctness='uniform',fused_attention=True)``: the same press whose sums come from the chunked pass
  that computes the layer's attention output, in place of sdpa.

Each mode but ``sdpa`` is a press spec (``evaluation.catalogue.specs``), built as the harness builds it.

Prints and writes medians and their ratios to the sdpa floor. ``--long`` adds one chunked run at a length
where eager is not attempted, to show it completes.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from report import write_report
from transformers import DynamicCache

from evaluation.catalogue.resolved import resolve_press
from evaluation.catalogue.specs import FULL_CACHE
from evaluation.runs.data_location import shared_data
from evaluation.runs.models import load_model
from evaluation.runs.terminal import quiet_libraries

ROOT = Path(__file__).resolve().parents[1]
CHUNKED = "rmm(correctness='uniform')"
MODES = ("sdpa", "h2o", CHUNKED, "rmm(correctness='uniform',fused_attention=True)")


def token_ids(tokenizer, data: Path, length: int):
    """The first ``length`` tokens of the multi_news contexts, concatenated in file order."""
    ids: list[int] = []
    with data.open() as handle:
        for line in handle:
            ids += tokenizer.encode(json.loads(line)["context"])
            if len(ids) >= length:
                return torch.tensor([ids[:length]])
    raise SystemExit(f"{data} holds fewer than {length} tokens")


def child(mode: str, length: int, data: Path) -> None:
    """One measured prefill; prints {"seconds", "peak_rss_gb"} as JSON."""
    quiet_libraries()
    resolved = resolve_press(FULL_CACHE if mode == "sdpa" else mode)
    press = resolved.build(0.5)
    model, tokenizer = load_model(attn_implementation="eager" if resolved.reads_weights else "sdpa")
    ids = token_ids(tokenizer, data, length)
    cache = DynamicCache()
    start = time.perf_counter()
    with torch.no_grad():
        if press is None:
            model.model(input_ids=ids, past_key_values=cache)
        else:
            with press(model):
                model.model(input_ids=ids, past_key_values=cache)
    seconds = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(json.dumps({"seconds": seconds, "peak_rss_gb": peak_gb, "kept": cache.get_seq_length()}))


def measure(mode: str, length: int, data: Path) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(length), "--data", str(data)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", nargs="+", type=int, default=[2048, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long", type=int, default=16384, help=f"one {CHUNKED} run at this length (0: none)")
    parser.add_argument("--data", type=Path, default=shared_data() / "longbench" / "multi_news.jsonl")
    parser.add_argument("--output", type=Path, default=ROOT / "results/bench/scoring.json")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.data)
        return

    report: dict = {"repeats": args.repeats, "lengths": {}}
    for length in args.lengths:
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for repeat in range(args.repeats):
            for mode in MODES:
                runs[mode].append(measure(mode, length, args.data))
                print(f"{length} tokens, repeat {repeat + 1}, {mode}: {runs[mode][-1]}", flush=True)
        medians = {
            mode: {key: statistics.median(r[key] for r in results) for key in ("seconds", "peak_rss_gb")}
            for mode, results in runs.items()
        }
        floor = medians["sdpa"]
        for mode in MODES:
            medians[mode]["time_ratio"] = medians[mode]["seconds"] / floor["seconds"]
            medians[mode]["rss_ratio"] = medians[mode]["peak_rss_gb"] / floor["peak_rss_gb"]
        report["lengths"][str(length)] = medians
    if args.long:
        report["long"] = {"length": args.long, CHUNKED: measure(CHUNKED, args.long, args.data)}
    write_report(args.output, report)
    print("\nmedians (ratio to the no-press sdpa prefill):")
    for length, medians in report["lengths"].items():
        for mode, m in medians.items():
            print(
                f"{length:>6} {mode:<12} {m['seconds']:7.1f} s ({m['time_ratio']:.2f}x)  "
                f"{m['peak_rss_gb']:.2f} GB ({m['rss_ratio']:.2f}x)"
            )
    if args.long:
        print(f"{args.long:>6} {CHUNKED} completes: {report['long'][CHUNKED]}")


if __name__ == "__main__":
    main()
