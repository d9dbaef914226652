"""What the shared-prefill engine keeps besides the KV cache, measured on SmolLM2 at 8k tokens.

One ``History`` over the first 8,192 tokens of the multi_news contexts, serving a set of presses: the bytes of
its KV cache, of the stored layer inputs (the newest rows each press's hook reads; every row if one press reads
them all), of the rotary embeddings, and of the column sums H2O and RMM read. Two press sets: the default grid
(with ``rmm(lag=64)``), whose presses read at most SnapKV's 65 rows, and the same plus ExpectedAttention, which
reads every row. Writes ``results/bench/engine_memory.json``; docs/benchmarks.md states what the same structures
take for Qwen2.5-7B by arithmetic.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from report import write_report

from evaluation.catalogue.resolved import resolve_press
from evaluation.engine.history import History
from evaluation.runs.data_location import shared_data
from evaluation.runs.models import load_model
from evaluation.runs.terminal import quiet_libraries

ROOT = Path(__file__).resolve().parents[1]
PRESS_SETS = {
    "default": ["snapkv", "h2o", "streaming_llm", "tova", "rmm", "rmm(lag=64)"],
    "default+expected_attention": [
        "snapkv",
        "h2o",
        "streaming_llm",
        "tova",
        "rmm",
        "rmm(lag=64)",
        "expected_attention",
    ],
}


def nbytes(tensors) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def measure(model, ids, presses: list[str]) -> dict:
    history = History(model, frozenset({"context"}), [resolve_press(name).needs for name in presses])
    start = time.perf_counter()
    with torch.no_grad():
        history.extend(ids, "context")
    seconds = time.perf_counter() - start
    cache = nbytes(t for layer in history.cache.layers for t in (layer.keys, layer.values))
    inputs = nbytes(history.inputs)
    rotary = nbytes({id(t): t for pair in history.rotary for t in pair}.values())
    sums = nbytes(t for layers in history.sums.values() for t in layers)
    sums += nbytes(t for layers in history.pending.values() for t in layers.values())
    return {
        "presses": presses,
        "tokens": history.length,
        "stored_rows": history.rows if history.rows is not None else history.length,
        "statistics": [repr(s) for s in history.statistics],
        "bytes": {"kv_cache": cache, "layer_inputs": inputs, "rotary": rotary, "column_sums": sums},
        "over_kv_cache": {"layer_inputs": inputs / cache, "rotary": rotary / cache, "column_sums": sums / cache},
        "extend_seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--data", type=Path, default=shared_data() / "longbench" / "multi_news.jsonl")
    parser.add_argument("--output", type=Path, default=ROOT / "results" / "bench" / "engine_memory.json")
    args = parser.parse_args()
    quiet_libraries()
    model, tokenizer = load_model()
    ids: list[int] = []
    with args.data.open() as handle:
        for line in handle:
            ids += tokenizer.encode(json.loads(line)["context"])
            if len(ids) >= args.length:
                break
    report = {name: measure(model, ids[: args.length], presses) for name, presses in PRESS_SETS.items()}
    write_report(args.output, report)
    for name, entry in report.items():
        mib = {key: round(value / 2**20, 1) for key, value in entry["bytes"].items()}
        print(f"{name}: {mib} MiB, {entry['stored_rows']} rows stored, {entry['extend_seconds']} s")


if __name__ == "__main__":
    main()
