"""LongBench's likelihood-only path against generate-and-likelihood, side by side in one process.

For each of the first ``--n`` multi_news examples cut to ``--max-length`` tokens (default 2 x 2,048, the committed
run's truncation), the committed grid's cells (``--presses`` at keep 50% and 25%: 13 cells) on the shared path twice:
``--likelihood-only`` (one prefill, every press's cache from its hook, one batched forward of the question and the
gold answer over them all) and as the committed run does (the same, then greedy decoding to the official 512
tokens), the order alternating. Wall times, their ratio (generate / likelihood-only: what the likelihood-only path
saves, stated, no goal), the decoder forwards of each side, and the largest difference between the two sides' answer
NLLs (the same forward: equal).

Writes ``results/bench/likelihood_only.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

from grid import multi_news_grid
from report import write_report

from evaluation.protocols.longbench.work import case_rows
from evaluation.runs.data_location import shared_data
from presses.harness import language_model

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ["full", "snapkv", "h2o", "streaming_llm", "tova", "rmm", "rmm(lag=64)"]  # make eval-longbench-committed


def timed(model, tokenizer, config, case, cells) -> tuple[float, int, list[float]]:
    """One example's cells on the shared path: seconds, decoder forwards, each cell's answer NLL."""
    calls = []
    hook = language_model(model).register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        start = time.perf_counter()
        rows = case_rows(model, tokenizer, config, case, cells)
        seconds = time.perf_counter() - start
    finally:
        hook.remove()
    return seconds, len(calls), [row["answer_nll"] for row in rows]


def example_report(model, tokenizer, config, case, cells, likelihood_first: bool) -> dict:
    """Both sides of one example, in the order ``likelihood_first`` says."""
    sides = {"likelihood_only": replace(config, likelihood_only=True), "generate": config}
    measured = {}
    for side in ("likelihood_only", "generate") if likelihood_first else ("generate", "likelihood_only"):
        measured[side] = timed(model, tokenizer, sides[side], case, cells)
        print(f"{case.id}: {side} {measured[side][0]:.1f} s, {measured[side][1]} forwards", flush=True)
    (only_s, only_calls, only_nll), (generate_s, generate_calls, generate_nll) = (
        measured["likelihood_only"],
        measured["generate"],
    )
    return {
        "id": case.id,
        "context_tokens": case.prompt.context_ids.shape[1],
        "likelihood_only_s": round(only_s, 2),
        "generate_s": round(generate_s, 2),
        "ratio": round(generate_s / only_s, 2),
        "likelihood_only_forwards": only_calls,
        "generate_forwards": generate_calls,
        "max_nll_difference": max(abs(a - b) for a, b in zip(only_nll, generate_nll, strict=True)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2, help="multi_news examples (default 2)")
    parser.add_argument("--max-length", type=int, default=2048, help="prompt tokens (default 2048)")
    parser.add_argument("--data", type=Path, default=shared_data() / "longbench")
    parser.add_argument("--presses", nargs="+", default=COMMITTED, help="press specs (default the committed grid)")
    parser.add_argument(
        "--answer-length", type=int, default=None, help="cut answers and generation to this (a quick check only)"
    )
    parser.add_argument("--output", type=Path, default=ROOT / "results/bench/likelihood_only.json")
    args = parser.parse_args()
    model, tokenizer, config, cells, examples = multi_news_grid(args.presses, args.n, args.data, args.max_length)
    if args.answer_length is not None:
        examples = [replace(case, answer_length=args.answer_length) for case in examples]
    rows = [
        example_report(model, tokenizer, config, case, cells, likelihood_first=index % 2 == 0)
        for index, case in enumerate(examples)
    ]
    report = {"presses": args.presses, "cells": len(cells), "answer_length": args.answer_length, "examples": rows}
    report["median_ratio"] = statistics.median(row["ratio"] for row in rows)
    write_report(args.output, report)
    print(f"generate-and-likelihood / likelihood-only: {report['median_ratio']:.2f}x (stated, no goal)")


if __name__ == "__main__":
    main()
