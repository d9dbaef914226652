"""The GPU device check runs here too, every check at reduced sizes on a tiny model, so it is ready the day a GPU
is lent; and it fails on an error row, not only on an exit code."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tests.helpers import SHARED_DATA
from tests.test_locomo_protocol import CONVERSATION, model_dir  # noqa: F401

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device_check.py"
spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
device_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(device_check)

CHECKS = {
    "longbench-shared",
    "longbench-per-cell",
    "longbench-fp16",
    "longbench-device-map",
    "longbench-ray",
    "locomo",
    "long-prefill",
}


def data_root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "locomo").mkdir(parents=True)
    (root / "longbench").symlink_to(SHARED_DATA / "longbench")
    (root / "locomo" / "locomo10.json").write_text(json.dumps([CONVERSATION]))
    return root


def test_every_check_runs_on_cpu_and_the_summary_records_it(model_dir, tmp_path):  # noqa: F811
    output = tmp_path / "check"
    argv = ["--model", str(model_dir), "--device", "cpu", "--n", "1", "--max-length", "256", "--questions", "2"]
    argv += ["--conversation", "conv-test", "--long-length", "512", "--long-history", "4096"]
    argv += ["--presses", "full", "rmm"]
    argv += ["--data", str(data_root(tmp_path))]
    report = device_check.main([*argv, "--output", str(output)])
    assert set(report["checks"]) == CHECKS
    failures = {name: check["failure"] for name, check in report["checks"].items() if not check["passed"]}
    assert not failures and report["passed"]
    assert json.loads((output / "summary.json").read_text()) == report
    for name, check in report["checks"].items():
        assert check["rows"] > 0 and check["peak_memory_bytes"] > 0, name
        assert (output / name / "scorecard.md").is_file()
    dtypes = {name: json.loads((output / name / "run.json").read_text())["config"]["dtype"] for name in CHECKS}
    assert dtypes.pop("longbench-fp16") == "float16" and set(dtypes.values()) == {"bfloat16"}


def test_an_error_row_fails_the_check(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    rows = [{"press": "full", "score": 1.0}, {"press": "knorm", "error": "cannot run on this example"}]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    check = device_check.run_check("run", ["--help"], tmp_path)  # exits 0, writes nothing
    assert (check["rows"], check["error_rows"], check["passed"]) == (2, 1, False)
    assert check["failure"] == "1 error rows, the first: knorm: cannot run on this example"
