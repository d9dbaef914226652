"""A run's numerics: its intra-op thread count is a recorded setting that every process computing its rows sets
before the model loads (a resume at another count is refused, a run.json from before the setting reads as this
machine's cores), run.json records what the floats depend on, and on SmolLM2 a short perplexity cell and a LongBench
cell computed at 1 and at 2 threads agree within ``reproduce``'s measured tolerances, their text byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from evaluation.cli.main import main
from evaluation.cli.reproduce import TOLERANCES, configured, row_difference
from evaluation.protocols.shipped import protocols
from evaluation.runs.numerics import machine_threads
from tests.helpers import SHARED_DATA
from tests.test_longbench_protocol import data_dir, model_dir  # noqa: F401 (fixtures)
from tests.test_longbench_protocol import longbench as run_longbench


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
