"""The answer likelihood's cost: a LongBench shared-path example that generates to the official length, with and
without its gold answer forced through every cache, side by side.

For each of the first ``--n`` multi_news examples (official truncation unless ``--max-length``), one process runs
the example's cells (``--presses`` at keep 50% and 25%, default the default grid) on the shared path twice: as a
run does, the first gold answer teacher-forced over every cache in the decoding batch (``answer_nll``), and the
same example with its answers removed, so that nothing is forced and the decode alone runs. The order alternates
from example to example. Prints and writes each example's wall times, their ratio (with / without), the median
ratio, and whether the predictions are the same both ways (the likelihood must not move them). Goal: median ratio
<= 1.10.

Writes ``results/bench/likelihood.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

from grid import multi_news_grid
from report import write_report

from evaluation.catalogue.specs import DEFAULT_PRESSES
from evaluation.protocols.longbench.work import case_rows
from evaluation.runs.data_location import shared_data

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=3, help="multi_news examples (default 3)")
    parser.add_argument("--max-length", type=int, default=None, help="prompt tokens (default: official)")
    parser.add_argument("--data", type=Path, default=shared_data() / "longbench")
    parser.add_argument("--output", type=Path, default=ROOT / "results/bench/likelihood.json")
    parser.add_argument("--presses", nargs="+", default=list(DEFAULT_PRESSES), help="press specs (default grid)")
    args = parser.parse_args()
    report = with_and_without(args)
    write_report(args.output, report)


def with_and_without(args: argparse.Namespace) -> dict:
    model, tokenizer, config, cells, examples = multi_news_grid(args.presses, args.n, args.data, args.max_length)
    report: dict = {"presses": args.presses, "cells": len(cells), "examples": []}
    for index, example in enumerate(examples):
        seconds, predictions, tokens = {}, {}, {}
        for forced in (True, False) if index % 2 == 0 else (False, True):
            run = example if forced else replace(example, gold=None)
            start = time.perf_counter()
            rows = case_rows(model, tokenizer, config, run, cells)
            seconds[forced] = time.perf_counter() - start
            predictions[forced] = [row["prediction"] for row in rows]
            tokens[forced] = [row.get("answer_tokens") for row in rows]
            print(f"{example.id}: {'with' if forced else 'without'} the likelihood {seconds[forced]:.1f} s", flush=True)
        report["examples"].append(
            {
                "id": example.id,
                "context_tokens": example.prompt.context_ids.shape[1],
                "answer_tokens": tokens[True][0],
                "with_seconds": round(seconds[True], 1),
                "without_seconds": round(seconds[False], 1),
                "ratio": round(seconds[True] / seconds[False], 3),
                "same_predictions": predictions[True] == predictions[False],
            }
        )
    report["median_ratio"] = statistics.median(example["ratio"] for example in report["examples"])
    for example in report["examples"]:
        print(
            f"{example['id']} ({example['context_tokens']} tokens, answer {example['answer_tokens']}): with "
            f"{example['with_seconds']} s, without {example['without_seconds']} s, ratio {example['ratio']:.3f}, "
            f"same predictions: {example['same_predictions']}"
        )
    print(f"median with / without the likelihood: {report['median_ratio']:.3f} (goal <= 1.10)")
    return report


if __name__ == "__main__":
    main()
