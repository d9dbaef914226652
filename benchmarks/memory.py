"""Peak memory of LongBench's shared path at 8k tokens, as a multiple of the KV cache, this checkout against another
commit in the same run.

One SmolLM2 prompt of 8,192 - 64 tokens (multi_news contexts joined, middle-truncated as the official pred.py
does) through ``run_shared`` with the 13 cells of the committed grid (the full cache, and snapkv, h2o,
streaming_llm, tova, rmm, rmm(lag=64) at keep 50% and 25%), 8 answer tokens each. Each tree runs in a fresh
process (peak RSS is a per-process figure): the growth of its peak RSS during ``run_shared`` over the bytes of the
full KV cache, and its wall time, the two trees interleaved ``--repeats`` times (the time ratio checks that this
checkout's CPU path is no slower than the reference's). Beside them, in this tree, a plain prefill of the
same prompt (the model's own forward with a cache, nothing else), and the ideal: the full cache plus each
compressed cache once (1 + the kept fractions of the compressed cells). The children run with glibc's mmap
threshold fixed at 64 KiB, so that freed tensors leave the resident set and the peak RSS follows the peak of
live tensors. The reference tree is a temporary git worktree of ``--reference`` (default: the commit before the
engine ran each press's own hook). Writes ``results/bench/memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from report import write_report

from evaluation.runs.data_location import shared_data

ROOT = Path(__file__).resolve().parents[1]
PRESSES = ["full", "snapkv", "h2o", "streaming_llm", "tova", "rmm", "rmm(lag=64)"]
CHILD = """
import dataclasses, json, resource, sys, tempfile, time
from pathlib import Path
import torch
from transformers import DynamicCache
if Path("evaluation/engine/serving.py").is_file():  # the engine's cell server, its cells' presses resolved
    from evaluation.catalogue.budgets import Budget, Cell
    from evaluation.catalogue.resolved import resolve_press
    from evaluation.protocols.longbench.cells import case_of
    from evaluation.protocols.longbench.config import LongBenchConfig
    from evaluation.protocols.longbench.data import load_configs, load_task
    from evaluation.protocols.longbench.prompts import build_prompt
    from evaluation.protocols.single_turn import cells as single_turn
    from evaluation.runs.models import ModelSettings
    from evaluation.runs.terminal import quiet_libraries

    def run_shared(model, tokenizer, config, task, example, prompt, cells):
        grid = [Cell(resolve_press(press), budget) for press, budget in cells]
        case = case_of(example, task, tokenizer, length, False)
        return list(single_turn.run_cells(model, tokenizer, config, case, grid))
elif Path("evaluation/protocols/single_turn").is_dir():  # cells of a case, shared by the single-turn protocols
    from evaluation.catalogue.budgets import Budget
    from evaluation.protocols.longbench.cells import case_of
    from evaluation.protocols.longbench.config import LongBenchConfig
    from evaluation.protocols.longbench.data import load_configs, load_task
    from evaluation.protocols.longbench.prompts import build_prompt
    from evaluation.protocols.single_turn import cells as single_turn
    from evaluation.runs.models import ModelSettings
    from evaluation.runs.terminal import quiet_libraries

    def run_shared(model, tokenizer, config, task, example, prompt, cells):
        return single_turn.run_shared(model, tokenizer, config, case_of(example, task, tokenizer, length, False), cells)
elif Path("evaluation/protocols").is_dir():  # the layout of c75a70c and after
    from evaluation.catalogue.budgets import Budget
    from evaluation.protocols.longbench.cells import run_shared
    from evaluation.protocols.longbench.config import LongBenchConfig
    from evaluation.protocols.longbench.data import load_configs, load_task
    from evaluation.protocols.longbench.prompts import build_prompt
    from evaluation.runs.models import ModelSettings
    from evaluation.runs.terminal import quiet_libraries
else:  # the flat layout before it (the reference 003305c)
    from evaluation.backends import quiet_libraries
    from evaluation.budgets import Budget
    from evaluation.longbench.data import load_configs, load_task
    from evaluation.longbench.prompts import build_prompt
    from evaluation.longbench.runner import LongBenchConfig, run_shared
    from evaluation.models import ModelSettings

strays = [name for name, module in sys.modules.items() if name.startswith("evaluation")
          and not Path(getattr(module, "__file__", None) or ".").resolve().is_relative_to(Path.cwd().resolve())]
if strays:  # the editable install's finder fills in a module the tree lacks from the installed checkout
    raise SystemExit(f"modules from outside {Path.cwd()}: {strays}")
quiet_libraries()
data, length, presses, plain = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4] == "plain"
model, tokenizer = ModelSettings().load()
task = dataclasses.replace(load_configs(data, ["multi_news"])["multi_news"], max_new_tokens=8)
examples = load_task(data, "multi_news", None)
example = dataclasses.replace(examples[0], context="\\n\\n".join(e.context for e in examples[:12]))
prompt = build_prompt(example, task, tokenizer, length, query_aware=False)
budgets = [Budget("ratio", 0.5), Budget("ratio", 0.75)]
output = Path(tempfile.mkdtemp())
config = LongBenchConfig(model=ModelSettings(), tasks=["multi_news"], presses=presses, budgets=budgets, n=1,
                         query_aware=False, data_dir=str(data), output=output)
cells = [(presses[0], None)] + [(press, budget) for press in presses[1:] for budget in budgets]  # full first
layers, heads, dim = model.config.num_hidden_layers, model.config.num_key_value_heads, model.config.head_dim
kv = 2 * layers * heads * dim * prompt.context_ids.shape[1] * 4
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
with torch.no_grad():
    if plain:
        model(prompt.context_ids, past_key_values=DynamicCache(), logits_to_keep=1)
        rows = []
    else:
        rows = run_shared(model, tokenizer, config, task, example, prompt, cells)
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
kept = [row["kept_tokens"] / prompt.context_ids.shape[1] for row in rows if row["press"] != "full"]
print(json.dumps({"context_tokens": prompt.context_ids.shape[1], "cells": len(rows), "kv_cache_bytes": kv,
                  "peak_growth_bytes": after - before, "peak_over_kv_cache": (after - before) / kv,
                  "ideal_over_kv_cache": 1 + sum(kept), "seconds": seconds}))
"""


def measure(tree: Path, args: argparse.Namespace, plain: bool = False) -> dict:
    command = [sys.executable, "-c", CHILD, str(args.data), str(args.length), json.dumps(PRESSES)]
    command.append("plain" if plain else "shared")
    environment = {**os.environ, "PYTHONPATH": str(tree), "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run(command, cwd=tree, env=environment, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", default="003305c", help="the commit to compare with (default 003305c)")
    parser.add_argument("--length", type=int, default=8192 - 64, help="prompt tokens (default 8128)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--data", type=Path, default=shared_data() / "longbench")
    parser.add_argument("--output", type=Path, default=ROOT / "results/bench/memory.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        reference = Path(scratch) / "reference"
        subprocess.run(["git", "worktree", "add", "--detach", str(reference), args.reference], cwd=ROOT, check=True)
        try:
            runs: dict[str, list[dict]] = {"this checkout": [], f"reference {args.reference}": [], "plain prefill": []}
            for _ in range(args.repeats):
                for name, tree, plain in zip(runs, (ROOT, reference, ROOT), (False, False, True), strict=True):
                    runs[name].append(measure(tree, args, plain))
                    print(name, runs[name][-1], flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(reference)], cwd=ROOT, check=True)
    report = {
        "presses": PRESSES,
        "runs": runs,
        "median_peak_over_kv_cache": {
            name: statistics.median(run["peak_over_kv_cache"] for run in values) for name, values in runs.items()
        },
        "ideal_over_kv_cache": runs["this checkout"][0]["ideal_over_kv_cache"],
        "median_seconds": {name: statistics.median(run["seconds"] for run in values) for name, values in runs.items()},
    }
    reference = report["median_seconds"][f"reference {args.reference}"]
    report["seconds_over_reference"] = report["median_seconds"]["this checkout"] / reference
    write_report(args.output, report)
    print(json.dumps(report["median_peak_over_kv_cache"]))
    print(f"run_shared time, this checkout over the reference: {report['seconds_over_reference']:.3f}")


if __name__ == "__main__":
    main()
