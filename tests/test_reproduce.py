"""``python -m evaluation reproduce``: a fresh run on a tiny model reproduces (whole units, and a streamed run's
first questions, which equal the whole stream's), a changed character or a likelihood changed by more than its
field's tolerance is reported with its row and field (exit 1), a change within it is not, and a folder it cannot
reproduce is one line and exit status 2 before any model is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.cli.main import main
from evaluation.cli.reproduce import TOLERANCES, cpu_kernels, first_difference, kernels_note, row_difference, sample
from evaluation.protocols.protocol import Plan
from evaluation.runs.backends import Unit
from evaluation.runs.models import ModelSettings
from tests.helpers import SHARED_DATA
from tests.test_answer_likelihood import locomo_data, locomo_model_dir  # noqa: F401 (fixtures)
from tests.test_locomo_protocol import locomo as run_locomo
from tests.test_longbench_protocol import data_dir, model_dir  # noqa: F401 (fixtures)
from tests.test_longbench_protocol import longbench as run_longbench

ALL = "99"  # a sample larger than any tiny run: every unit


def rows_of(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]


def rewrite(output: Path, change) -> dict:
    """The run's rows with ``change(rows)`` applied to them in place; the changed row returned."""
    rows = rows_of(output)
    changed = change(rows)
    (output / "predictions.jsonl").write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return changed


def reproduce(capsys, *runs: str) -> tuple[int, list[str], str]:
    capsys.readouterr()
    status = main(["reproduce", *runs])
    captured = capsys.readouterr()
    return status, captured.out.strip().splitlines(), captured.err


@pytest.fixture
def longbench_run(model_dir, data_dir, tmp_path) -> Path:  # noqa: F811
    output = tmp_path / "run"
    assert run_longbench(model_dir, data_dir, output) == 0
    return output


def test_a_fresh_longbench_run_reproduces_and_a_changed_character_does_not(longbench_run, capsys):
    status, lines, _ = reproduce(capsys, f"{longbench_run}:{ALL}")
    assert status == 0, lines
    assert lines[-1] == f"reproduced: {longbench_run} (4 units, {len(rows_of(longbench_run))} rows)"
    assert lines[0].startswith(f"{longbench_run}: 4 of 4 units, about ")

    def one_character(rows: list[dict]) -> dict:
        row = next(row for row in rows if row["press"] == "snapkv" and row["prediction"])
        row["prediction"] = row["prediction"][:-1] + ("x" if row["prediction"][-1] != "x" else "y")
        return row

    changed = rewrite(longbench_run, one_character)
    status, lines, _ = reproduce(capsys, f"{longbench_run}:{ALL}")
    key = (changed["task"], changed["id"], changed["press"], changed["budget"])
    assert status == 1
    assert lines[-1].startswith(f"differs: {longbench_run}: {key} prediction: committed {changed['prediction']!r}")


@pytest.mark.parametrize(("change", "status"), [(1e-5, 1), (1e-8, 0)])
def test_an_answer_likelihood_reproduces_to_1e6(longbench_run, capsys, change, status):
    def nudged(rows: list[dict]) -> dict:
        row = next(row for row in rows if isinstance(row.get("answer_nll"), float))
        row["answer_nll"] += change
        return row

    changed = rewrite(longbench_run, nudged)
    code, lines, _ = reproduce(capsys, f"{longbench_run}:{ALL}")
    assert code == status, lines
    if status:
        key = (changed["task"], changed["id"], changed["press"], changed["budget"])
        assert lines[-1].startswith(f"differs: {longbench_run}: {key} answer_nll: committed {changed['answer_nll']!r}")


def test_a_sample_is_the_cheapest_whole_units(longbench_run, capsys):
    record = json.loads((longbench_run / "run.json").read_text())
    seconds = record["sessions"][-1]["unit_seconds"]
    cheapest = min(seconds, key=seconds.get)
    status, lines, _ = reproduce(capsys, str(longbench_run))
    assert status == 0 and lines[-1] == f"reproduced: {longbench_run} (1 units, 9 rows)", "one example, its 9 cells"
    assert lines[0].startswith(f"{longbench_run}: 1 of 4 units, about ")
    rewrite(longbench_run, lambda rows: next(r for r in rows if f"{r['task']}/{r['id']}" == cheapest).update(score=2.0))
    assert reproduce(capsys, str(longbench_run))[0] == 1, "the cheapest unit is the one re-run"


def test_a_streamed_runs_first_questions_are_the_whole_streams(locomo_model_dir, locomo_data, tmp_path, capsys):  # noqa: F811
    output = tmp_path / "locomo"
    assert run_locomo(locomo_model_dir, locomo_data, output, "--placement", "evidence", "--budgets", "60") == 0
    rows = rows_of(output)
    cells = len(rows) // 4
    asked_last = max((row for row in rows if row["press"] == "full"), key=lambda row: row["turn"])
    rewrite(output, lambda rows: next(r for r in rows if r == asked_last).update(answer_nll=1.0))
    for questions in (1, 3):  # the third is asked after the second session, the first two after the first
        status, lines, _ = reproduce(capsys, f"{output}:{questions}")
        assert status == 0, lines
        assert lines[-1] == f"reproduced: {output} (1 units, {questions * cells} rows)", "stopped after the sample"
        assert f"({questions} of their 4 steps)" in lines[0]
    status, lines, _ = reproduce(capsys, f"{output}:4")
    assert status == 1 and " answer_nll: committed 1.0 vs now " in lines[-1], "the changed row is the last asked"


def test_a_perplexity_run_reproduces_each_position_to_its_tolerance(model_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("KVET_CACHE", str(tmp_path / "cache"))
    output = tmp_path / "ppl"
    argv = ["perplexity", "--model", str(model_dir), "--texts", "multi_news:0", "locomo:conv-26", "--length", "40"]
    argv += ["--budgets", "16", "--data", str(SHARED_DATA), "--presses", "full", "tova", "rmm(lag=16)"]
    assert main([*argv, "--output", str(output)]) == 0
    status, lines, _ = reproduce(capsys, f"{output}:{ALL}")
    assert status == 0 and lines[-1] == f"reproduced: {output} (2 units, 6 rows)", lines  # the full cache, one budget

    def nudged(rows: list[dict]) -> dict:
        row = next(row for row in rows if row["press"] == "tova")
        row["nll_by_position"][1] -= 2 * TOLERANCES["nll_by_position"]
        return row

    changed = rewrite(output, nudged)
    status, lines, _ = reproduce(capsys, f"{output}:{ALL}")
    assert status == 1
    assert f"{(changed['text'], 'tova', 'tokens=16')} nll_by_position[1]: committed" in lines[-1]


def test_a_row_from_before_a_field_reproduces_as_what_its_protocol_says_it_stands_for(
    model_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
):
    monkeypatch.setenv("KVET_CACHE", str(tmp_path / "cache"))
    output = tmp_path / "ppl"
    argv = ["perplexity", "--model", str(model_dir), "--texts", "multi_news:0", "--length", "24", "--budgets", "16"]
    argv += ["--data", str(SHARED_DATA), "--presses", "tova", "--cells-one-at-a-time", "--output", str(output)]
    assert main(argv) == 0
    record = json.loads((output / "run.json").read_text())
    del record["config"]["cells_one_at_a_time"]  # as perplexity's run.json and rows were before batching
    (output / "run.json").write_text(json.dumps(record))
    rewrite(output, lambda rows: [row.pop("path") for row in rows])
    status, lines, _ = reproduce(capsys, f"{output}:{ALL}")
    assert status == 0 and lines[-1] == f"reproduced: {output} (1 units, 1 rows)", lines
    rewrite(output, lambda rows: rows[-1].update(path="batched"))
    status, lines, _ = reproduce(capsys, f"{output}:{ALL}")
    assert status == 1 and lines[-1].endswith("path: committed 'batched' vs now 'per-cell'"), lines


def test_bad_input_is_one_line_each_and_exit_2_before_any_model(longbench_run, tmp_path, monkeypatch, capsys):
    def no_model(self):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(ModelSettings, "load", no_model)
    empty = tmp_path / "empty"
    empty.mkdir()
    status, lines, err = reproduce(capsys, str(longbench_run), str(empty))
    assert status == 2 and lines == []
    assert err.strip() == f"error: {empty}: no run.json here: give a run folder (results/<protocol>/<run>)"

    record_path = longbench_run / "run.json"
    record = json.loads(record_path.read_text())
    for name, edit in {
        "protocol 'gone' is not one this code has": lambda r: r.update(protocol="gone"),
        "the recorded setting window=3 is one this code no longer has": lambda r: r["config"].update(window=3),
        "the recorded path 'nowhere' is not one this code takes": lambda r: r["config"].update(path="nowhere"),
    }.items():
        changed = json.loads(json.dumps(record))
        edit(changed)
        record_path.write_text(json.dumps(changed))
        status, lines, err = reproduce(capsys, str(longbench_run))
        assert status == 2 and lines == [] and len(err.strip().splitlines()) == 1 and name in err, err

    record["config"]["data_fingerprint"]["trec.jsonl"] = "0" * 64  # the run read other data
    record_path.write_text(json.dumps(record))
    status, lines, _ = reproduce(capsys, str(longbench_run))
    assert status == 1 and lines[-1].startswith(f"differs: {longbench_run}: setting data_fingerprint: committed {{")


def test_a_sample_ranks_units_by_recorded_seconds_failed_units_last():
    units = [Unit(name, None, frozenset({(name, step) for step in range(3)})) for name in "abcd"]
    committed = {key: {"error": "refused"} if key[0] == "a" else {} for unit in units for key in unit.keys}
    steps = lambda unit: [frozenset({key}) for key in sorted(unit.keys)]  # noqa: E731
    seconds = {"a": 0.0, "b": 30.0, "c": 6.0}
    chosen = sample(Plan(units, lambda *args: None), steps, committed, seconds, 4)
    assert [(s.unit.name, s.steps, s.of, s.seconds) for s in chosen] == [("c", 3, 3, 6.0), ("b", 1, 3, 10.0)]
    assert chosen[1].unit.keys == {("b", 0)}


def test_floats_differ_beyond_1e6_and_everything_else_exactly():
    assert first_difference([1.0, {"x": "é"}], [1.0 + 5e-7, {"x": "é"}], "f") == ""
    assert first_difference([1.0, 2.0], [1.0, 2.0 + 2e-6], "f") == "f[1]: committed 2.0 vs now 2.000002"
    assert first_difference("abc", "abd", "prediction") == "prediction: committed 'abc' vs now 'abd'"
    assert first_difference(1, 1.0, "tokens") == "tokens: committed 1 vs now 1.0"
    assert first_difference(None, 0.0, "answer_nll") == "answer_nll: committed None vs now 0.0"
    assert first_difference(float("nan"), float("nan"), "nll") == ""


def test_each_field_is_compared_under_its_own_tolerance():
    committed = {"nll": 3.0, "nll_by_position": [4.0, 3.0], "answer_nll": 1.0, "score": 3.0}
    within = {"nll": 3.0 + 9e-7, "nll_by_position": [4.0, 3.0 - 3e-6], "answer_nll": 1.0 + 9e-7, "score": 3.0 + 9e-7}
    assert row_difference("k", committed, within) == ""
    assert row_difference("k", committed, {**within, "nll": 3.0 + 2e-6}).startswith("k nll: committed 3.0 vs now")
    beyond = {**within, "nll_by_position": [4.0, 3.0 - 5e-6]}
    assert row_difference("k", committed, beyond).startswith("k nll_by_position[1]: committed 3.0")


def test_a_difference_names_the_kernels_when_the_run_used_another_instruction_sets():
    def session(capability: str, units: int = 1, device: str = "cpu") -> dict:
        return {"units_run": units, "numerics": {"device": device, "cpu_capability": capability}}

    record = {"sessions": [session("AVX512"), session("AVX2", units=0), session("AVX512"), {"units_run": 2}]}
    made_with = cpu_kernels(record)
    assert made_with == {"AVX512"}
    assert kernels_note(made_with, "AVX512") == ""
    assert kernels_note(made_with, "AVX2").startswith(" (made with torch's AVX512 kernels, this machine's are AVX2's")
    assert cpu_kernels({"sessions": [session("AVX2", device="cuda:0")]}) == frozenset()
    assert kernels_note(frozenset(), "AVX2") == ""
