"""Bad input, a third round, for what a run writes and what ``score`` and ``scorecard`` read: no write follows a
link out of its folder, a failed write names its file, Ctrl-C stops in one line and the run resumes, and every
malformed input to the reporting commands is one line that says what to do. Tiny models or none, seconds each."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from evaluation.cli.main import main
from tests.helpers import without_progress
from tests.test_bad_input import finished_run, one_line_error, scorecard_of  # noqa: F401
from tests.test_longbench_protocol import data_dir, longbench, model_dir, read_rows  # noqa: F401

SMALL = ("--tasks", "trec", "--presses", "full", "knorm", "--n", "1")
PRECIOUS = b'{"kept": "as it was"}\n{"torn'


def outside(tmp_path: Path) -> Path:
    """A file outside every run folder, its last line torn: what a write through a link would cut or overwrite."""
    target = tmp_path / "elsewhere" / "precious.txt"
    target.parent.mkdir()
    target.write_bytes(PRECIOUS)
    return target


def linked(folder: Path, name: str, target: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / name
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    return link


def listing(folder: Path) -> dict[str, bytes | str]:
    """Each entry of ``folder``: a file's bytes, a link's target."""
    return {
        path.name: os.readlink(path) if path.is_symlink() else path.read_bytes()
        for path in sorted(folder.iterdir())
        if not path.is_dir()
    }


RUN_FILES = [
    "predictions.jsonl",
    "run.json",
    ".lock",
    "progress.log",
    "scorecard.md",
    "scorecard.csv",
    "scorecard.png",
    "forest.png",
    "contrasts.csv",
]


@pytest.mark.parametrize("name", RUN_FILES)
def test_a_link_where_a_run_file_belongs_is_refused_before_anything_is_touched(
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    capsys,
    name,
):
    target, run = outside(tmp_path), tmp_path / "run"
    linked(run, name, target)
    assert longbench(model_dir, data_dir, run, *SMALL) == 2
    error = one_line_error(capsys)
    assert f"{run / name} is a link" in error and "--output" in error
    assert target.read_bytes() == PRECIOUS, "the link's target is neither cut back nor written"
    assert listing(run) == {name: str(target)}, "no lock, no run.json, no row"


def test_a_dangling_link_creates_nothing_outside_the_run(model_dir, data_dir, tmp_path, capsys):  # noqa: F811
    run, target = tmp_path / "run", tmp_path / "elsewhere.md"
    linked(run, "scorecard.md", target)
    assert longbench(model_dir, data_dir, run, *SMALL) == 2
    assert "is a link" in one_line_error(capsys)
    assert not target.exists()


def test_a_resumed_run_whose_scorecard_is_a_link_leaves_the_target_and_the_run_as_they_were(
    finished_run,  # noqa: F811
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    capsys,
):
    run, target = tmp_path / "run", outside(tmp_path)
    shutil.copytree(finished_run, run)
    linked(run, "scorecard.md", target)
    before = listing(run)
    assert longbench(model_dir, data_dir, run, "--tasks", "trec", "--presses", "full", "knorm") == 2
    assert "scorecard.md is a link" in one_line_error(capsys)
    assert target.read_bytes() == PRECIOUS and listing(run) == before, "no session added, nothing rewritten"


@pytest.mark.parametrize("name", ["scorecard.csv", "scorecard.md", "scorecard.png", "forest.png", "contrasts.csv"])
def test_the_combined_scorecard_refuses_a_link_under_its_output(finished_run, tmp_path, capsys, name):  # noqa: F811
    target, card = outside(tmp_path), tmp_path / "card"
    linked(card, name, target)
    assert scorecard_of(tmp_path, finished_run) == 2
    assert f"{card / name} is a link" in one_line_error(capsys)
    assert target.read_bytes() == PRECIOUS and listing(card) == {name: str(target)}


def test_a_result_store_on_a_link_is_refused_before_its_torn_line_is_cut(tmp_path):
    from evaluation.errors import EvaluationError
    from evaluation.runs.store import ResultStore

    target = outside(tmp_path)
    link = linked(tmp_path / "run", "predictions.jsonl", target)
    with pytest.raises(EvaluationError, match=r"predictions\.jsonl is a link"):
        ResultStore(link, lambda row: row["kept"])
    assert target.read_bytes() == PRECIOUS


def test_a_file_is_replaced_by_a_new_one_never_written_through_a_link(tmp_path):
    from evaluation.errors import EvaluationError
    from evaluation.runs.files import append_only, replaced, write_atomically

    target = outside(tmp_path)
    link = linked(tmp_path / "run", "run.json", target)
    write_atomically(link, "{}\n")
    assert not link.is_symlink() and link.read_text() == "{}\n" and target.read_bytes() == PRECIOUS
    with pytest.raises(RuntimeError), replaced(link) as staging:
        staging.write_text("half")
        raise RuntimeError("a failed write")
    assert link.read_text() == "{}\n" and listing(link.parent) == {"run.json": b"{}\n"}, "nothing left behind"
    appended = linked(tmp_path / "run", "predictions.jsonl", target)
    with pytest.raises(EvaluationError, match=r"predictions\.jsonl is a link"):
        append_only(appended)
    assert target.read_bytes() == PRECIOUS


def test_a_scorecard_output_that_is_a_file_is_refused(finished_run, tmp_path, capsys):  # noqa: F811
    card = tmp_path / "card"
    card.write_text("mine")
    assert scorecard_of(tmp_path, finished_run) == 2
    assert f"cannot write to {card}: it is a file, not a folder" in one_line_error(capsys)
    assert card.read_text() == "mine"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--seed", "-1"], "argument --seed: -1 is below 0"),
        (["--seed", "1.5"], "argument --seed: '1.5' is not a whole number"),
        (["--resamples", "0"], "argument --resamples: 0 is below 1"),
    ],
)
def test_scorecard_numbers_are_range_checked_by_name(finished_run, tmp_path, capsys, options, message):  # noqa: F811
    assert main(["scorecard", str(finished_run), "--output", str(tmp_path / "card"), *options]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error
    assert not (tmp_path / "card").exists()


def test_a_reference_press_no_run_holds_names_the_presses_there_are(finished_run, tmp_path, capsys):  # noqa: F811
    assert main(["scorecard", str(finished_run), "--output", str(tmp_path / "card"), "--reference", "tova"]) == 2
    error = one_line_error(capsys)
    assert "--reference 'tova' is a press of none of the runs" in error and "full, knorm" in error


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"press": "tova"}, "press 'tova'"),
        ({"budget": "tokens=999", "budget_label": "999 tokens"}, "budget 'tokens=999'"),
    ],
)
def test_a_row_from_a_grid_its_run_did_not_ask_for_is_refused_not_pooled(
    finished_run,  # noqa: F811
    tmp_path,
    capsys,
    change,
    message,
):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    rows = read_rows(run)
    stray = {**next(row for row in rows if row["press"] == "knorm"), **change}
    with (run / "predictions.jsonl").open("a") as handle:
        handle.write(json.dumps(stray) + "\n")
    assert scorecard_of(tmp_path, run) == 2
    error = one_line_error(capsys)
    assert f"{run / 'predictions.jsonl'}:{len(rows) + 1}" in error and message in error and "run.json" in error
    assert not (tmp_path / "card").exists()


def test_a_torn_last_line_says_what_it_is_and_what_to_do(finished_run, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    data = (run / "predictions.jsonl").read_bytes()
    (run / "predictions.jsonl").write_bytes(data + data[:40])
    assert scorecard_of(tmp_path, run) == 2
    error = one_line_error(capsys)
    assert "is cut short" in error and "torn" in error and "run the same command" in error and "delete" in error
    assert main(["score", "longbench", str(run / "predictions.jsonl")]) == 2
    assert "is cut short" in one_line_error(capsys)


@pytest.mark.parametrize(
    ("benchmark", "row", "message"),
    [
        ("longbench", {"task": "trec", "prediction": None, "answers": ["a"]}, "line 2: prediction None is not text"),
        ("longbench", {"task": "trec", "prediction": 3, "answers": ["a"]}, "line 2: prediction 3 is not text"),
        ("longbench", {"task": "trec", "prediction": "a", "answers": "a"}, "line 2: answers 'a' is not a list"),
        ("longbench", {"task": "trec", "prediction": "a", "answers": [1]}, "line 2: answers [1] is not a list"),
        (
            "longbench",
            {"task": "trec", "prediction": "a", "answers": ["a"], "all_classes": "ab"},
            "line 2: all_classes 'ab' is not a list",
        ),
        ("longbench", {"task": 7, "prediction": "a", "answers": ["a"]}, "line 2: task 7 is not text"),
        ("locomo", {"category": 5, "prediction": None, "answer": "a"}, "line 2: prediction None is not text"),
        ("locomo", {"category": 1, "prediction": "a", "answer": None}, "line 2: answer None is not"),
        ("locomo", {"category": 1, "prediction": "a", "answer": [1]}, "line 2: answer [1] is not"),
        ("locomo", {"category": 1, "answer": "a", "error": "a window"}, "line 2 is a failed cell (a window)"),
        ("locomo", {"category": 1, "answer": "a"}, "line 2: no prediction"),
    ],
)
def test_rescoring_a_value_of_the_wrong_type_names_the_file_and_line(tmp_path, capsys, benchmark, row, message):
    good = {
        "longbench": {"task": "trec", "prediction": "a", "answers": ["a"], "all_classes": None},
        "locomo": {"category": 1, "prediction": "a", "answer": "a"},
    }[benchmark]
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    assert main(["score", benchmark, str(path)]) == 2
    assert f"{path}: {message}" in one_line_error(capsys)


def test_a_category_5_question_scores_without_a_gold_answer(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"category": 5, "prediction": "Not mentioned.", "answer": None}) + "\n")
    assert main(["score", "locomo", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["5"] == 1.0


def full_disk_on(monkeypatch, name: str) -> None:
    """The disk fills as ``name`` (or a new file being written to replace it) is synced, as a real write fails:
    an ``OSError`` that names no file."""
    sync = os.fsync
    stem, suffix = os.path.splitext(name)

    def fsync(descriptor: int) -> None:
        written = Path(os.readlink(f"/proc/self/fd/{descriptor}")).name
        if written == name or (written.startswith(f".{stem}-") and written.endswith(suffix)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        sync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize("name", ["predictions.jsonl", "run.json", "scorecard.md", "scorecard.png", "forest.png"])
def test_a_full_disk_names_the_file_it_was_writing(
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    capsys,
    monkeypatch,
    name,
):
    run = tmp_path / "run"
    full_disk_on(monkeypatch, name)
    assert longbench(model_dir, data_dir, run, *SMALL) == 2
    error = one_line_error(capsys)
    assert f"the disk is full ({run / name})" in error and "run the same command again" in error
    assert not [path.name for path in run.iterdir() if path.name.startswith(".") and path.name != ".lock"]


def test_a_full_disk_under_the_combined_scorecard_names_the_file(finished_run, tmp_path, capsys, monkeypatch):  # noqa: F811
    full_disk_on(monkeypatch, "scorecard.csv")
    assert scorecard_of(tmp_path, finished_run) == 2
    assert f"the disk is full ({tmp_path / 'card' / 'scorecard.csv'})" in one_line_error(capsys)


def test_ctrl_c_stops_in_one_line_and_the_run_resumes_to_an_uninterrupted_runs_rows(
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    capsys,
    monkeypatch,
):
    from evaluation.runs.store import ResultStore

    whole, run = tmp_path / "whole", tmp_path / "run"
    grid = ("--tasks", "trec", "--presses", "full", "knorm", "tova")
    assert longbench(model_dir, data_dir, whole, *grid) == 0
    capsys.readouterr()
    append, calls = ResultStore.append, []

    def interrupted(self: ResultStore, row: dict) -> None:
        calls.append(row)
        if len(calls) == 7:  # in the second example's cells
            raise KeyboardInterrupt
        append(self, row)

    monkeypatch.setattr(ResultStore, "append", interrupted)
    assert longbench(model_dir, data_dir, run, *grid) == 130
    err = without_progress(capsys.readouterr().err)
    assert err.startswith("interrupted: ") and "\n" not in err and "run the same command to resume" in err, err
    assert len(read_rows(run)) == 6 and not json.loads((run / "run.json").read_text())["sessions"][0]["finished"]
    monkeypatch.undo()
    assert longbench(model_dir, data_dir, run, *grid) == 0, "the interrupted session left no lock held"
    assert read_rows(run) == read_rows(whole)
    sessions = json.loads((run / "run.json").read_text())["sessions"]
    assert [s["finished"] for s in sessions] == [False, True] and sessions[1]["units_run"] == 1
