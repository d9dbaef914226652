"""The GPU device check runs here too, on a tiny model in bfloat16, so it is ready the day a GPU is lent."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tests.helpers import SHARED_DATA
from tests.test_locomo_protocol import data_file, model_dir  # noqa: F401

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device_check.py"
spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
device_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(device_check)


def test_the_device_check_runs_both_protocols_on_cpu(model_dir, data_file, tmp_path):  # noqa: F811
    output = tmp_path / "check"
    argv = ["--model", str(model_dir), "--device", "cpu", "--dtype", "bfloat16", "--n", "1", "--max-length", "256"]
    argv += ["--questions", "2", "--conversation", "conv-test", "--longbench", str(SHARED_DATA / "longbench")]
    argv += ["--locomo", str(data_file), "--output", str(output)]
    report = device_check.main(argv)
    assert set(report["wall_seconds"]) == {"longbench-sdpa", "locomo-sdpa"}
    assert json.loads((output / "timings.json").read_text()) == report
    for run in ("longbench-sdpa", "locomo-sdpa"):
        assert (output / run / "scorecard.md").is_file()
        assert json.loads((output / run / "run.json").read_text())["config"]["dtype"] == "bfloat16"
