"""Perplexity's streaming batched across presses against cell by cell, side by side in one process.

For ``--presses`` (default the six the committed run streams, knorm included) at one ``--budget`` over the first
``--texts`` multi_news texts cut to ``--length`` tokens (default 4 x 1,024), exact per-token eviction: every press's
cells in one batch (``batched_nll``, one forward per token for them all: the protocol's default) against each cell
as a batch of its own (``streamed_nll``, ``--cells-one-at-a-time``), ``--repeats`` times, the order alternating.
Wall time of each side, their ratio (goal >= 3), and the largest difference between the two of any token's NLL and
of any text's mean NLL (a row's ``nll``): the two round differently (a forward over more rows), which moves NLLs by
about 3e-5 and may flip an eviction whose scores are that close (docs/perplexity.md, "Batching").

Writes ``results/bench/streaming.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from report import write_report

from evaluation.protocols.perplexity.config import PerplexityConfig
from evaluation.protocols.perplexity.work import streamed_presses, text_token_ids
from evaluation.runs.data_location import shared_data
from evaluation.runs.models import ModelSettings
from evaluation.runs.terminal import quiet_libraries

ROOT = Path(__file__).resolve().parents[1]
PRESSES = ["streaming_llm", "tova", "h2o", "rmm", "rmm(lag=64)", "knorm"]


def texts(count: int, length: int, data: Path) -> torch.Tensor:
    """The first ``count`` multi_news texts' first ``length`` tokens, as the protocol cuts them."""
    names = [f"multi_news:{index}" for index in range(count)]
    config = PerplexityConfig(
        model=ModelSettings(), data_root=data, texts=names, length=length, presses=[], budgets=[], output=ROOT
    )
    return torch.tensor(text_token_ids(config)[1])


def streams(model, ids: torch.Tensor, presses: list[str], budget: int, chunk: int, batched_first: bool) -> dict:
    """Both sides once, in the order ``batched_first`` says: the seconds of each and its NLLs (presses, texts,
    length - 1)."""
    run = {}
    for side in ("batched", "cells") if batched_first else ("cells", "batched"):
        start = time.perf_counter()
        run[side] = streamed_presses(model, ids, presses, budget, chunk, batched=side == "batched")
        run[f"{side}_s"] = time.perf_counter() - start
    return run


def measure(args: argparse.Namespace) -> dict:
    quiet_libraries()
    model, _ = ModelSettings().load()
    ids = texts(args.texts, args.length, args.data)
    runs = []
    for repeat in range(args.repeats):
        run = streams(model, ids, args.presses, args.budget, args.chunk, batched_first=repeat % 2 == 0)
        difference = run.pop("batched") - run.pop("cells")
        runs.append(
            {
                **run,
                "ratio": run["cells_s"] / run["batched_s"],
                "max_nll_difference": float(difference.abs().max()),
                "max_text_nll_difference": float(difference.mean(-1).abs().max()),
            }
        )
        print(f"repeat {repeat + 1}: batched {run['batched_s']:.1f} s, cell by cell {run['cells_s']:.1f} s", flush=True)
    return {
        "presses": args.presses,
        "budget": args.budget,
        "texts": args.texts,
        "length": args.length,
        "chunk": args.chunk,
        "repeats": runs,
        "median_ratio": statistics.median(run["ratio"] for run in runs),
        "goal": ">= 3",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presses", nargs="+", default=PRESSES)
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--texts", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--data", type=Path, default=shared_data())
    parser.add_argument("--output", type=Path, default=ROOT / "results/bench/streaming.json")
    args = parser.parse_args()
    with torch.no_grad():
        report = write_report(args.output, measure(args))
    print(f"cell by cell / batched: {report['median_ratio']:.2f}x (goal >= 3)")


if __name__ == "__main__":
    main()
