"""Perplexity's streaming batched across presses against cell by cell, side by side in one process.

For ``--presses`` (default the six the committed run streams, knorm included) at one ``--budget`` over the first
``--texts`` multi_news texts cut to ``--length`` tokens (default 4 x 1,024), exact per-token eviction: every press's
cells in one batch (``batched_nll``, one forward per token for them all: the protocol's default) against each cell
as a batch of its own (``streamed_nll``, ``--cells-one-at-a-time``), ``--repeats`` times, the order alternating.
Wall time of each side (and of each press's cell), their ratio (goal >= 3), and the largest difference between the
two of any token's NLL and of any text's mean NLL (a row's ``nll``): the two round differently (a forward over more
rows), which moves NLLs by about 3e-5 and may flip an eviction whose scores are that close (docs/perplexity.md,
"Batching"). Beside it, this machine's ceiling for the ratio: a step of the model with no press over a cache of the
budget, as many times as there are presses one batch of texts at a time, against one step of them all in one batch
(the forwards alone, which batching shares; each press's own hook costs the same on either side).

Writes ``results/bench/streaming.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from report import write_report
from transformers import DynamicCache

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
    """Both sides once, in the order ``batched_first`` says: the seconds of each (and of each press's cell) and its
    NLLs (presses, texts, length - 1)."""
    run: dict = {}
    for side in ("batched", "cells") if batched_first else ("cells", "batched"):
        start = time.perf_counter()
        if side == "batched":
            run[side] = streamed_presses(model, ids, presses, budget, chunk, batched=True)
        else:
            cells, run["cell_s"] = [], {}
            for press in presses:
                began = time.perf_counter()
                cells.append(streamed_presses(model, ids, [press], budget, chunk, batched=False)[0])
                run["cell_s"][press] = time.perf_counter() - began
            run[side] = torch.stack(cells)
        run[f"{side}_s"] = time.perf_counter() - start
    return run


def ceiling(model, ids: torch.Tensor, presses: int, budget: int, chunk: int, steps: int = 32) -> dict:
    """The forwards alone over a cache of ``budget`` tokens with no press: the median step of ``ids``'s texts, as
    many times as there are presses, against one step of them all in one batch (``steps`` steps each, the cache
    cropped back to ``budget`` after each): the ratio batching the forwards alone gives."""
    medians = {}
    for side, rows in (("one_batch_step_s", ids), ("all_in_one_step_s", ids.repeat(presses, 1))):
        cache = DynamicCache()
        model(input_ids=rows[:, :budget], past_key_values=cache)
        positions = torch.arange(budget, budget + chunk)[None]
        seconds = []
        for _ in range(steps):
            start = time.perf_counter()
            model(input_ids=rows[:, budget : budget + chunk], past_key_values=cache, position_ids=positions)
            seconds.append(time.perf_counter() - start)
            cache.crop(budget)
        medians[side] = statistics.median(seconds)
    return {**medians, "ratio": presses * medians["one_batch_step_s"] / medians["all_in_one_step_s"]}


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
        "ceiling": ceiling(model, ids, len(args.presses), args.budget, args.chunk),
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
    print(
        f"cell by cell / batched: {report['median_ratio']:.2f}x (goal >= 3; this machine's ceiling "
        f"{report['ceiling']['ratio']:.2f}x)"
    )


if __name__ == "__main__":
    main()
