"""A device check: both protocols, end to end, on a model that needs no hub, in minutes.

LongBench (``--n`` multi_news examples truncated to ``--max-length`` tokens, the default presses at keep 50%
and 25%) and LoCoMo (the first ``--questions`` questions of ``--conversation``, evidence placement, 512 tokens)
run through the command line with ``--dtype`` (default bfloat16) and each attention implementation that works
here (sdpa, and flash_attention_2 where the flash-attn package and a CUDA device exist). Everything lands under
``--output``: one run folder (predictions, scorecard, run.json) per protocol and implementation, and
``timings.json`` with each run's wall time. On one GPU the default sizes take a few minutes; on this CPU too
(``tests/test_device_check.py`` runs it on a tiny model).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def implementations(device: str) -> list[str]:
    flash = device.startswith("cuda") and importlib.util.find_spec("flash_attn") is not None
    return ["sdpa", "flash_attention_2"] if flash else ["sdpa"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--conversation", default="conv-30")
    parser.add_argument("--longbench", type=Path, default=ROOT.parent / "shared/data/longbench")
    parser.add_argument("--locomo", type=Path, default=ROOT.parent / "shared/data/locomo/locomo10.json")
    parser.add_argument("--output", type=Path, default=ROOT / "results/device_check")
    args = parser.parse_args(argv)
    common = ["--model", args.model, "--device", args.device, "--dtype", args.dtype]
    timings = {}
    for attention in implementations(args.device):
        longbench = ["longbench", "--data", str(args.longbench), "--n", str(args.n)]
        locomo = ["locomo", "--data", str(args.locomo), "--conversations", args.conversation, "--budgets", "512"]
        runs = {
            "longbench": [*longbench, "--max-length", str(args.max_length)],
            "locomo": [*locomo, "--max-turns", str(args.questions), "--placement", "evidence"],
        }
        for protocol, argv_ in runs.items():
            output = args.output / f"{protocol}-{attention}"
            command = [sys.executable, "-m", "evaluation", *argv_, *common, "--attn-implementation", attention]
            start = time.perf_counter()
            subprocess.run([*command, "--output", str(output)], cwd=ROOT, check=True)
            timings[f"{protocol}-{attention}"] = round(time.perf_counter() - start, 1)
            print(f"{protocol} with {attention}: {timings[f'{protocol}-{attention}']} s", flush=True)
    report = {"model": args.model, "device": args.device, "dtype": args.dtype, "wall_seconds": timings}
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "timings.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
