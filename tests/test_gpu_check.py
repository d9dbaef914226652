"""The GPU check's tiny form runs every phase on this CPU, from the data `make gpu-data` copies; a phase fails on an
error row, an answer over the cap, a missing refusal, an exception or its time bound."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check  # its dataclasses look their module up
spec.loader.exec_module(gpu_check)


@pytest.fixture(scope="module")
def gpu_data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("gpu_data")
    subprocess.run(["make", "-s", "gpu-data", f"GPU_DATA={folder}", f"SHARED_DATA={SHARED_DATA}"], cwd=ROOT, check=True)
    return folder


def test_make_gpu_data_copies_long_examples_and_one_conversation(gpu_data):
    examples = [json.loads(line) for line in (gpu_data / "longbench" / "multi_news.jsonl").read_text().splitlines()]
    assert len(examples) == 2 and all(len(e["context"].encode()) > gpu_check.REFUSED_LENGTH for e in examples)
    conversations = json.loads((gpu_data / "locomo" / "locomo10.json").read_text())
    assert [c["sample_id"] for c in conversations] == ["conv-30"]


@pytest.mark.slow
def test_every_phase_runs_on_the_cpu_and_the_report_records_it(gpu_data, tmp_path):
    output = tmp_path / "gpu_check.json"
    code = gpu_check.main(["--scale", "tiny", "--device", "cpu", "--data", str(gpu_data), "--output", str(output)])
    report = json.loads(output.read_text())
    failures = {phase["name"]: phase["errors"] for phase in report["phases"] if phase["errors"]}
    assert code == 0 and report["passed"] and not failures
    names = [phase["name"] for phase in report["phases"]]
    assert names[0] == "build" and len(names) == 9 and len(set(names)) == 9
    by_name = {phase["name"]: phase for phase in report["phases"]}
    assert by_name["grid-512"]["rows"] == by_name["grid-1024"]["rows"] == 17  # 9 presses x 2 ratios, full once
    assert by_name["per-cell-512"]["rows"] == 5 and by_name["decoding-press"]["rows"] == 2
    assert by_name["eager-h2o-32768-refused"]["rows"] == 1
    assert all(phase["seconds"] > 0 and phase["peak_bytes"] > 0 for phase in report["phases"])


def test_a_phase_fails_on_what_its_rows_say():
    good = {"press": "snapkv", "budget": "0.5", "generated_tokens": 16, "answer_nll": 2.0}
    assert gpu_check.row_errors([good]) == []
    assert gpu_check.row_errors([]) == ["the phase wrote no rows"]
    errors = gpu_check.row_errors([{**good, "generated_tokens": 17}, {**good, "answer_nll": float("nan")}])
    assert errors == [
        "snapkv @ 0.5: 17 answer tokens, over the cap of 16",
        "snapkv @ 0.5: answer likelihood nan",
    ]
    refused = {"press": "h2o", "refused": "eager attention over 32768 tokens needs ..."}
    assert gpu_check.row_errors([refused], refusal_expected=True) == []
    failed = {"press": "h2o", "budget": "0.5", "error": "eager attention over 32768 tokens needs ..."}
    assert gpu_check.row_errors([failed], refusal_expected=True) == [
        f"h2o @ 0.5: {failed['error']}",
        "eager H2O was not refused before it ran",
    ], "a refusal stored as a failed cell is not the refusal due"
    assert gpu_check.row_errors([good], refusal_expected=True) == ["eager H2O was not refused before it ran"]


def test_a_phase_past_its_bound_or_raising_is_an_error_and_the_report_goes_on():
    late, broken = gpu_check.PhaseReport("late"), gpu_check.PhaseReport("broken")
    with gpu_check.measured(late, "cpu", 1):
        time.sleep(3)
    with gpu_check.measured(broken, "cpu", 10):
        raise RuntimeError("device lost\nsecond line")
    assert late.errors == ["PhaseTimeout: ran past its bound of 1 s"] and 1 <= late.seconds < 3
    assert broken.errors == ["RuntimeError: device lost"]


def test_missing_data_is_one_line_before_any_work(tmp_path, capsys):
    assert gpu_check.main(["--scale", "tiny", "--device", "cpu", "--data", str(tmp_path), "--output", "x.json"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("run `make gpu-data` (copies a slice of the shared data into gpu_data/)")
    )
    assert not Path("x.json").exists()
