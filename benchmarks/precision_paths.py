"""How far LongBench's shared and per-cell paths part in one precision, on SmolLM2.

For the first ``--n`` multi_news examples cut to ``--max-length`` tokens, each press at each budget:

- kept positions: per layer and KV head, whether the shared path (the engine's history, the press's own hook on
  what it stored) keeps the same set of context positions as the per-cell path (KVPress's prefill under the press,
  eager where it reads the weights), and the mean overlap |A & B| / |A| of the two sets;
- predictions: both paths run through the LongBench protocol (answers capped at ``--answer-tokens``) and each cell's
  two predictions are compared.

Writes ``--output`` (JSON) and prints a line per press and budget.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check import run_protocol
from report import write_report

from evaluation.catalogue.budgets import parse_budgets, ratio_for
from evaluation.catalogue.resolved import resolve_press, resolve_presses
from evaluation.engine.history import History
from evaluation.engine.retention import kept_positions
from evaluation.protocols.longbench.data import load_configs, load_task
from evaluation.protocols.longbench.prompts import build_prompt
from evaluation.runs.data_location import shared_data
from evaluation.runs.models import SMOLLM2_ALIAS, ModelSettings
from evaluation.runs.terminal import quiet_libraries

PRESSES = ["h2o", "snapkv", "tova", "rmm"]
RATIOS = [0.5, 0.75]


def position_sets(full: DynamicCache, kept: DynamicCache) -> list[torch.Tensor]:
    """Per layer, the sorted positions of ``full`` each KV head of ``kept`` holds, (num_kv_heads, n_kept)."""
    sets = []
    for layer, (whole, compressed) in enumerate(zip(full.layers, kept.layers, strict=True)):
        positions = kept_positions(whole.keys, compressed.keys)
        if positions is None:
            raise RuntimeError(f"layer {layer}: a kept key is no copy of a full-cache key")
        sets.append(positions[0].sort(-1).values)
    return sets


@torch.no_grad()
def per_cell_sets(model, context_ids: torch.Tensor, spec: str, ratio: float) -> list[torch.Tensor]:
    """KVPress's prefill under the press, against a plain prefill with the same attention."""
    resolved = resolve_press(spec)
    model.set_attn_implementation("eager" if resolved.reads_weights else "sdpa")
    plain, pressed = DynamicCache(), DynamicCache()
    model(input_ids=context_ids, past_key_values=plain, logits_to_keep=1)
    with resolved.build(ratio, context_ids.shape[1])(model):
        model(input_ids=context_ids, past_key_values=pressed, logits_to_keep=1)
    model.set_attn_implementation("sdpa")
    return position_sets(plain, pressed)


@torch.no_grad()
def shared_sets(model, context_ids: torch.Tensor, spec: str, ratio: float) -> list[torch.Tensor]:
    """The engine's cache for the press, built from one full-cache history."""
    press = resolve_press(spec).build(ratio, context_ids.shape[1])
    history = History(model, frozenset({"context"}), [press])
    history.extend(context_ids[0].tolist(), "context")
    return position_sets(history.cache, history.compress(press).cache)


def compare(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[int, int, list[float], int | None]:
    """(layer x head sets equal, their number, each layer's mean overlap, the first layer where a set differs)."""
    same, total, overlaps, first = 0, 0, [], None
    for layer, (x, y) in enumerate(zip(a, b, strict=True)):
        equal = [torch.equal(hx, hy) for hx, hy in zip(x, y, strict=True)]
        same, total = same + sum(equal), total + len(equal)
        overlaps.append(
            sum(len(set(hx.tolist()) & set(hy.tolist())) / max(len(hx), 1) for hx, hy in zip(x, y, strict=True))
            / len(x)
        )
        if first is None and not all(equal):
            first = layer
    return same, total, overlaps, first


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--n", type=int, default=3, help="multi_news examples (default 3)")
    parser.add_argument("--max-length", type=int, default=512, help="prompt tokens (default 512)")
    parser.add_argument("--answer-tokens", type=int, default=32, help="answer cap of the predictions (default 32)")
    parser.add_argument("--data", type=Path, default=shared_data() / "longbench")
    parser.add_argument("--output", type=Path, default=Path("scratch") / "precision_paths.json")
    args = parser.parse_args(argv)
    quiet_libraries()
    settings = ModelSettings(SMOLLM2_ALIAS, args.dtype)
    model, tokenizer = settings.load()
    resolve_presses(PRESSES, False)
    task_config = load_configs(args.data, ["multi_news"])["multi_news"]
    examples = load_task(args.data, "multi_news", args.n)
    prompts = [build_prompt(e, task_config, tokenizer, args.max_length, False).context_ids for e in examples]

    argv_common = ["longbench", "--data", str(args.data), "--n", str(args.n), "--max-length", str(args.max_length)]
    argv_common += ["--presses", "full", *PRESSES]
    rows = {
        path: {
            (row["id"], row["press"], row["budget"]): row
            for row in run_protocol((model, tokenizer), [*argv_common, "--path", path], settings, args.answer_tokens)
        }
        for path in ("shared", "per-cell")
    }
    report: dict = {"dtype": args.dtype, "n": args.n, "max_length": args.max_length, "cells": {}}
    for spec in PRESSES:
        for budget in parse_budgets(RATIOS, None):
            same = total = 0
            overlaps: list[list[float]] = []
            firsts = []
            for context_ids in prompts:
                ratio = ratio_for(budget, context_ids.shape[1])
                counts = compare(
                    shared_sets(model, context_ids, spec, ratio), per_cell_sets(model, context_ids, spec, ratio)
                )
                same, total = same + counts[0], total + counts[1]
                overlaps.append(counts[2])
                firsts.append(counts[3])
            cells = [key for key in rows["shared"] if key[1] == spec and key[2] == budget.key]
            predicted = sum(rows["shared"][key]["prediction"] == rows["per-cell"][key]["prediction"] for key in cells)
            entry = {
                "same_sets": f"{same} of {total}",
                "mean_overlap": round(sum(map(sum, overlaps)) / sum(map(len, overlaps)), 4),
                "per_layer_overlap": [round(sum(layer) / len(layer), 4) for layer in zip(*overlaps, strict=True)],
                "first_differing_layer": firsts,
                "same_predictions": f"{predicted} of {len(cells)}",
                "paths": sorted({rows[p][key]["path"] for p in rows for key in cells}),
            }
            report["cells"][f"{spec} @ {budget.label}"] = entry
            print(
                f"{spec} @ {budget.label}: kept sets equal {entry['same_sets']} (layer x head x example), overlap "
                f"{entry['mean_overlap']}, first differing layer {firsts}; predictions equal "
                f"{entry['same_predictions']}",
                flush=True,
            )
    full = [key for key in rows["shared"] if key[1] == "full"]
    report["full_same_predictions"] = (
        f"{sum(rows['shared'][k]['prediction'] == rows['per-cell'][k]['prediction'] for k in full)} of {len(full)}"
    )
    write_report(args.output, report)
    return report


if __name__ == "__main__":
    main()
