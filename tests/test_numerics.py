"""A run's numerics: its intra-op thread count is a recorded setting that every process computing its rows sets
before the model loads (a resume at another count is refused, a run.json from before the setting reads as this
machine's cores), run.json records what the floats depend on, and on SmolLM2 a short perplexity cell and a LongBench
cell computed at 1 and at 2 threads agree within ``reproduce``'s measured tolerances, their text byte for byte, and
each tolerance is at least twice the largest difference ``benchmarks/numerics.py`` measured (docs/reliability.md
states both)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from evaluation.cli.main import main
from evaluation.cli.reproduce import TOLERANCE, TOLERANCES, configured, row_difference
from evaluation.protocols.shipped import protocols
from evaluation.runs.numerics import machine_threads
from tests.helpers import SHARED_DATA
from tests.test_claims import ROOT, RUNS
from tests.test_longbench_protocol import data_dir, model_dir  # noqa: F401 (fixtures)
from tests.test_longbench_protocol import longbench as run_longbench

MARGIN = 2  # a tolerance is at least twice the largest difference measured: another machine's kernels, untested
BENCH = ROOT / "results/bench/numerics.json"


@pytest.fixture
def restored_threads():
    """A run sets this process's thread count and deterministic kernels: the test's own are put back after it."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def rows_by_key(output: Path) -> dict:
    record = json.loads((output / "run.json").read_text())
    protocol = protocols()[record["protocol"]]
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    return {protocol.row_key(row): row for row in rows}


def test_a_run_records_and_sets_its_threads_and_a_resume_repeats_them(
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    restored_threads,
    capsys,
):
    output = tmp_path / "run"
    assert run_longbench(model_dir, data_dir, output, "--threads", "1") == 0
    assert torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()
    record = json.loads((output / "run.json").read_text())
    assert record["config"]["threads"] == 1
    numerics = record["sessions"][-1]["numerics"]
    assert numerics["threads"] == 1 and numerics["deterministic"] is True
    assert numerics["torch"] == torch.__version__ and numerics["cpu_capability"] and "blas" in numerics
    capsys.readouterr()
    assert run_longbench(model_dir, data_dir, output, "--threads", "2") == 2, "a resume at another count"
    assert "threads: stored 1, asked 2" in capsys.readouterr().err


def test_a_run_json_before_threads_reads_as_this_machines_cores(model_dir, data_dir, tmp_path, restored_threads):  # noqa: F811
    output = tmp_path / "run"
    assert run_longbench(model_dir, data_dir, output, "--threads", "1") == 0
    record = json.loads((output / "run.json").read_text())
    _, config = configured(output, record, tmp_path / "again")
    assert config.model.threads == 1, "a reproduction runs at the recorded count"
    del record["config"]["threads"]
    _, config = configured(output, record, tmp_path / "again")
    assert config.model.threads == machine_threads()


PERPLEXITY_CELL = ["perplexity", "--texts", "multi_news:0", "locomo:conv-26", "--length", "64", "--budgets", "16"]
LONGBENCH_CELL = ["longbench", "--tasks", "multi_news", "--n", "1", "--max-length", "256", "--max-new-tokens", "8"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        pytest.param([*PERPLEXITY_CELL, "--presses", "streaming_llm", "--data", str(SHARED_DATA)], id="perplexity"),
        pytest.param(
            [*LONGBENCH_CELL, "--presses", "full", "tova", "--ratios", "0.5", "--data", str(SHARED_DATA / "longbench")],
            id="longbench",
        ),
    ],
)
def test_one_cell_at_1_and_2_threads_agrees_within_the_tolerances(argv, tmp_path, restored_threads):
    rows = {}
    for threads in (1, 2):
        output = tmp_path / str(threads)
        assert main([*argv, "--threads", str(threads), "--output", str(output)]) == 0
        rows[threads] = rows_by_key(output)
    assert rows[1].keys() == rows[2].keys() and rows[1]
    floats = {field for row in rows[1].values() for field, value in row.items() if isinstance(value, float)}
    assert floats & TOLERANCES.keys(), "a likelihood is compared under its own tolerance"
    for key, row in rows[2].items():
        assert row_difference(key, rows[1][key], row) == "", "text byte for byte, floats within their tolerance"


def exponent(value: float, digits: int) -> str:
    """``value`` as docs/reliability.md writes it: 2.4e-7 (``digits`` 1), 1e-6 (``digits`` 0), 0."""
    return "0" if value == 0 else re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{value:.{digits}e}").replace("e+", "e")


def protocol(folder: Path) -> str:
    return json.loads((folder / "run.json").read_text())["protocol"]


def test_every_tolerance_is_at_least_twice_its_measured_bound_as_the_docs_state():
    report = json.loads(BENCH.read_text())
    measured, runs = report["largest"], report["runs"]
    assert {1, 2, report["machine_threads"]} <= set(report["threads"]), "1, 2 and the machine's threads"
    benched = {protocol(ROOT / text.rpartition(":")[0]) for text in runs}
    assert benched >= {protocol(ROOT / "results" / run) for run in RUNS}, "a run of every protocol reproduce re-runs"
    assert TOLERANCES.keys() <= measured.keys(), "every field with its own tolerance is measured"
    beyond = {field: value for field, value in measured.items() if MARGIN * value > TOLERANCES.get(field, TOLERANCE)}
    assert not beyond, f"floats that moved by more than half their tolerance: {beyond}"
    assert not [text for run in runs.values() for text in run["texts_differ"]], "text byte for byte at every count"
    docs = re.sub(r"\s+", " ", (ROOT / "docs/reliability.md").read_text())
    for field, tolerance in TOLERANCES.items():
        stated = f"`{field}` {exponent(tolerance, 0)} (measured {exponent(measured[field], 1)})"
        assert stated in docs, f"docs/reliability.md states {stated}"
    assert f"every other float {exponent(TOLERANCE, 0)}" in docs
