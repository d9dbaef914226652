"""Grid speed: a LongBench grid on the shared path against the per-cell path, side by side.

For each of the first ``--n`` multi_news examples (full default truncation), one process times the cells of
``--presses`` at keep 50% and 25% (default the default grid: 5 presses x 2 budgets + full cache, 11 cells;
``make bench`` also runs the 13 cells the shared path's goal was set on, the default grid and KVPress's own TOVA,
into ``grid_goal.json``) twice, as a run computes them (``longbench.work.case_rows``): on the per-cell reference
path (one KVPress prefill and one batch-1 decode per cell, eager attention for H2O) and on the shared path (one
full-cache prefill, every press's cache derived from it, one batched decode; a press that runs forwards of its
own, per cell). The path that runs first alternates from example to example. Prints and writes each
example's wall times, their ratio and the median ratio, and how many cells predicted the same text on both paths.

Then the Ray backend: the CLI's default grid (shared path) on ``--ray-n`` examples truncated to ``--ray-max-length``
tokens, run by the CLI with ``--backend ray`` on 1 worker and on 2 workers (each worker gets half the cores),
``--repeats`` times each, interleaved; the medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from report import write_report

from evaluation.catalogue.budgets import parse_budgets, press_cells
from evaluation.catalogue.resolved import resolve_presses
from evaluation.catalogue.specs import DEFAULT_PRESSES
from evaluation.protocols.longbench.config import LongBenchConfig
from evaluation.protocols.longbench.work import case_rows, cases
from evaluation.protocols.options import DEFAULT_RATIOS
from evaluation.runs.data_location import shared_data
from evaluation.runs.models import ModelSettings
from evaluation.runs.terminal import quiet_libraries

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2, help="multi_news examples (default 2)")
    parser.add_argument("--data", type=Path, default=shared_data() / "longbench")
    parser.add_argument("--output", type=Path, default=ROOT / "results/bench/grid.json")
    parser.add_argument("--presses", nargs="+", default=list(DEFAULT_PRESSES), help="press specs (default grid)")
    parser.add_argument("--ray-n", type=int, default=2, help="examples in the Ray rows (0: skip them)")
    parser.add_argument("--ray-max-length", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=1, help="Ray runs per worker count")
    args = parser.parse_args()
    report = {"paths": shared_against_per_cell(args)}
    if args.ray_n:
        report["ray"] = ray_workers(args)
    write_report(args.output, report)


def ray_workers(args: argparse.Namespace) -> dict:
    seconds: dict[int, list[float]] = {1: [], 2: []}
    for repeat in range(args.repeats):
        for workers in (1, 2):
            with tempfile.TemporaryDirectory() as output:
                command = [sys.executable, "-m", "evaluation", "longbench", "--data", str(args.data)]
                command += ["--n", str(args.ray_n), "--max-length", str(args.ray_max_length), "--output", output]
                command += ["--backend", "ray", "--workers", str(workers)]
                start = time.perf_counter()
                subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
                seconds[workers].append(time.perf_counter() - start)
            print(f"ray, {workers} worker(s), repeat {repeat + 1}: {seconds[workers][-1]:.1f} s", flush=True)
    medians = {workers: statistics.median(values) for workers, values in seconds.items()}
    print(f"ray: 2 workers / 1 worker wall time: {medians[2] / medians[1]:.3f}")
    return {
        "examples": args.ray_n,
        "max_length": args.ray_max_length,
        "seconds": seconds,
        "median_seconds": medians,
        "ratio_2_over_1": round(medians[2] / medians[1], 3),
    }


def multi_news_grid(presses: list[str], n: int, data: Path, max_length: int | None = None) -> tuple:
    """SmolLM2 loaded, a LongBench config of ``presses`` at keep 50% and 25% on multi_news, its cells, and each of
    the first ``n`` examples as a case (official truncation unless ``max_length``)."""
    settings = ModelSettings()
    quiet_libraries()
    model, tokenizer = settings.load()
    config = LongBenchConfig(
        model=settings,
        tasks=["multi_news"],
        presses=presses,
        budgets=parse_budgets(DEFAULT_RATIOS, None),
        n=n,
        max_length=max_length,
        query_aware=False,
        data_dir=str(data),
        output=Path(tempfile.mkdtemp()),
    )
    cells = press_cells(resolve_presses(config.presses), config.budgets, "")
    return model, tokenizer, config, cells, cases(config, model, tokenizer)


def shared_against_per_cell(args: argparse.Namespace) -> dict:
    model, tokenizer, config, cells, examples = multi_news_grid(args.presses, args.n, args.data)
    report: dict = {"presses": args.presses, "cells": len(cells), "examples": []}
    for index, example in enumerate(examples):
        seconds, predictions = {}, {}
        for path in ("shared", "per-cell") if index % 2 == 0 else ("per-cell", "shared"):
            start = time.perf_counter()
            rows = case_rows(model, tokenizer, replace(config, path=path), example, cells)
            seconds[path] = time.perf_counter() - start
            predictions[path] = {(row["press"], row["budget"]): row["prediction"] for row in rows}
            print(f"{example.id}: {path} {seconds[path]:.1f} s", flush=True)
        same = sum(prediction == predictions["per-cell"][cell] for cell, prediction in predictions["shared"].items())
        report["examples"].append(
            {
                "id": example.id,
                "context_tokens": example.prompt.context_ids.shape[1],
                "shared_seconds": round(seconds["shared"], 1),
                "per_cell_seconds": round(seconds["per-cell"], 1),
                "ratio": round(seconds["shared"] / seconds["per-cell"], 3),
                "same_predictions": same,
            }
        )
    report["median_ratio"] = statistics.median(example["ratio"] for example in report["examples"])
    for example in report["examples"]:
        print(
            f"{example['id']} ({example['context_tokens']} tokens): shared {example['shared_seconds']} s, "
            f"per-cell {example['per_cell_seconds']} s, ratio {example['ratio']:.3f}, "
            f"{example['same_predictions']}/{len(cells)} same predictions"
        )
    print(f"median shared / per-cell wall time: {report['median_ratio']:.3f}")
    return report


if __name__ == "__main__":
    main()
