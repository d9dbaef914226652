"""Bad input, a second round: each case is refused in one line that says what to do, before any model loads
wherever the input allows, and no run loses, mixes or silently drops work. Tiny models or none, seconds each."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from evaluation.cli.main import main
from tests.helpers import without_progress
from tests.test_locomo_protocol import CONVERSATION
from tests.test_longbench_protocol import data_dir, longbench, model_dir, read_rows  # noqa: F401


def one_line_error(capsys) -> str:
    err = without_progress(capsys.readouterr().err)
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def locomo_file(tmp_path: Path, conversations: list[dict]) -> str:
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps(conversations))
    return str(path)


def changed(**fields: object) -> dict:
    return {**json.loads(json.dumps(CONVERSATION)), **fields}


@pytest.mark.parametrize(
    ("conversations", "message"),
    [
        ([changed(), changed()], "sample_id conv-test names two conversations"),
        (
            [changed(qa=[{"question": "?", "answer": "a", "evidence": ["D99:1"], "category": 1}])],
            "cites evidence in session(s) [99], which the conversation does not hold",
        ),
        ([changed(conversation={"speaker_a": "A", "speaker_b": "B"})], "conv-test has no sessions to stream"),
    ],
)
def test_locomo_data_that_would_drop_questions_is_refused_before_the_model_loads(
    tmp_path, capsys, conversations, message
):
    data = locomo_file(tmp_path, conversations)
    argv = ["locomo", "--model", str(tmp_path / "absent"), "--data", data, "--placement", "evidence"]
    assert main([*argv, "--output", str(tmp_path / "run")]) == 2
    assert message in one_line_error(capsys)
    assert not (tmp_path / "run").exists()


def test_a_unit_that_returns_without_its_results_stops_the_run_and_names_it(tmp_path):
    from evaluation.errors import EvaluationError
    from evaluation.runs.backends import Unit, check_complete
    from evaluation.runs.store import ResultStore

    store = ResultStore(tmp_path / "predictions.jsonl", lambda row: row["k"])
    store.append({"k": "a"})
    with pytest.raises(EvaluationError, match="conv-x finished without 1 of its 2 results"):
        check_complete(Unit("conv-x", None, frozenset({"a", "b"})), store)


def test_an_edited_data_file_is_read_anew_even_with_its_old_size_and_time(tmp_path):
    """``datasets`` keyed its cache on the file's size and mtime: an edit in place kept serving the old rows."""
    import os

    from evaluation.runs.json_rows import load_json_rows

    path = tmp_path / "rows.jsonl"
    path.write_text('{"x": "aaaa"}\n')
    stat = path.stat()
    assert load_json_rows(path) == [{"x": "aaaa"}]
    path.write_text('{"x": "bbbb"}\n')
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert load_json_rows(path) == [{"x": "bbbb"}]


def test_a_trace_cache_file_is_named_by_a_hash_never_by_the_text_spec(tmp_path, monkeypatch):
    from evaluation.protocols.traces.record import load_or_record
    from tests.helpers import byte_tokenizer, tiny_model

    monkeypatch.setenv("KVET_CACHE", str(tmp_path / "cache"))
    conversation = changed(sample_id="../../../../escaped")
    conversation["conversation"]["session_1"] *= 30
    (tmp_path / "data" / "locomo").mkdir(parents=True)
    (tmp_path / "data" / "locomo" / "locomo10.json").write_text(json.dumps([conversation]))
    model, tokenizer = tiny_model("llama", "sdpa", vocab_size=260), byte_tokenizer()
    load_or_record(lambda: (model, tokenizer), "tiny", "locomo:../../../../escaped", 80, False, tmp_path / "data")
    written = [p for p in tmp_path.rglob("*.pt")]
    assert len(written) == 1 and written[0].parent == tmp_path / "cache" / "traces"
    assert len(written[0].stem) == 16 and all(c in "0123456789abcdef" for c in written[0].stem)


def test_a_ray_address_that_does_not_answer_is_an_error_within_a_bounded_time():
    from evaluation.errors import EvaluationError
    from evaluation.runs.backends import check_ray_address

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(EvaluationError, match=f"--ray-address 127.0.0.1:{port} does not answer within 2 s"):
        check_ray_address(f"127.0.0.1:{port}", seconds=2)


def test_a_resume_with_a_smaller_grid_keeps_every_grid_and_one_scorecard(model_dir, data_dir, tmp_path):  # noqa: F811
    output = tmp_path / "run"
    assert longbench(model_dir, data_dir, output, "--tasks", "trec", "--presses", "full", "knorm", "tova") == 0
    assert longbench(model_dir, data_dir, output, "--tasks", "trec", "--presses", "full", "knorm", "--n", "1") == 0
    sessions = json.loads((output / "run.json").read_text())["sessions"]
    assert [s["config"]["presses"] for s in sessions] == [["full", "knorm", "tova"], ["full", "knorm"]]
    assert [s["config"]["n"] for s in sessions] == [2, 1]
    header = next(line for line in (output / "scorecard.md").read_text().splitlines() if line.startswith("| cond"))
    csv = (output / "scorecard.csv").read_text()
    assert "tova" in header and "tova" in csv, "markdown and csv show the same cells: all the folder holds"
    assert "(2) |" in (output / "scorecard.md").read_text(), "the n it pools"


def test_a_token_budget_over_the_context_is_labelled_the_full_cache(model_dir, data_dir, tmp_path):  # noqa: F811
    output = tmp_path / "run"
    assert longbench(model_dir, data_dir, output, "--tasks", "trec", "--n", "1", "--budgets", "100000") == 0
    labels = {row["budget_label"] for row in read_rows(output) if row["budget"] == "tokens=100000"}
    assert labels == {"100000 tokens (>= the context: the full cache)"}


def test_duplicate_budgets_and_presses_run_once(model_dir, data_dir, tmp_path, capsys):  # noqa: F811
    argv = ["--tasks", "trec", "--n", "1", "--presses", "full", "knorm", "knorm", "--ratios", "0.5", "0.5"]
    assert longbench(model_dir, data_dir, tmp_path / "run", *argv, "--budgets", "100", "100") == 0
    rows = read_rows(tmp_path / "run")
    assert sorted((r["press"], r["budget"]) for r in rows) == [
        ("full", "full"),
        ("knorm", "ratio=0.5"),
        ("knorm", "tokens=100"),
    ]


def scorecard_of(tmp_path: Path, *runs: Path) -> int:
    return main(["scorecard", *map(str, runs), "--output", str(tmp_path / "card"), "--reference", "full"])


@pytest.fixture
def finished_run(model_dir, data_dir, tmp_path_factory):  # noqa: F811
    output = tmp_path_factory.mktemp("finished") / "run"
    assert longbench(model_dir, data_dir, output, "--tasks", "trec", "--presses", "full", "knorm") == 0
    return output


def damage(run: Path, how: str) -> None:
    path = run / ("run.json" if how.startswith("run.json") else "predictions.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    middle = len(lines) // 2
    edits = {
        "not a row": [*lines[:middle], b'{"hello": 1}\n', *lines[middle:]],
        "not utf-8": [*lines[:middle], b'{"task": "\xff\xfe"}\n', *lines[middle:]],
        "duplicated": [*lines[:middle], lines[0], *lines[middle:]],
        "run.json truncated": [path.read_bytes()[:20]],
        "run.json empty": [b""],
        "run.json not a record": [b"{}"],
    }
    path.write_bytes(b"".join(edits[how]))


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("not a row", "predictions.jsonl:"),
        ("not utf-8", "not UTF-8 text"),
        ("duplicated", "a second result for"),
        ("run.json truncated", "run.json is damaged"),
        ("run.json empty", "run.json is damaged"),
        ("run.json not a record", "run.json is damaged (no settings)"),
    ],
)
def test_a_damaged_run_folder_names_the_file_and_what_to_do(
    finished_run,
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    capsys,
    how,
    message,
):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    damage(run, how)
    assert longbench(model_dir, data_dir, run, "--tasks", "trec", "--presses", "full", "knorm") == 2
    assert message in one_line_error(capsys)
    if how.startswith("run.json") or how == "not utf-8":
        assert scorecard_of(tmp_path, run) == 2
        assert message in one_line_error(capsys)


def test_the_combined_scorecard_refuses_a_run_twice_and_runs_of_two_models(finished_run, tmp_path, capsys):
    assert scorecard_of(tmp_path, finished_run, finished_run) == 2
    assert "is given twice" in one_line_error(capsys)
    other = tmp_path / "other"
    shutil.copytree(finished_run, other)
    record = json.loads((other / "run.json").read_text())
    record["config"]["model"] = "another/model"
    (other / "run.json").write_text(json.dumps(record))
    assert scorecard_of(tmp_path, finished_run, other) == 2
    assert "the runs are of different models" in one_line_error(capsys)
    record["config"]["model"], record["config"]["max_length"] = (
        json.loads((finished_run / "run.json").read_text())["config"]["model"],
        99,
    )
    (other / "run.json").write_text(json.dumps(record))
    assert scorecard_of(tmp_path, finished_run, other) == 0, "runs of two settings: a table each, never pooled"
    markdown = (tmp_path / "card" / "scorecard.md").read_text()
    assert f"## LongBench ({finished_run})" in markdown and f"## LongBench ({other})" in markdown


def test_an_unwritable_cache_is_named_with_what_to_set(tmp_path, monkeypatch):
    from evaluation.errors import EvaluationError
    from evaluation.runs.models import SMOLLM2_ALIAS, ModelSettings

    monkeypatch.setenv("KVET_CACHE", "/dev/null/cache")
    with pytest.raises(EvaluationError, match=r"cannot write .*/dev/null/cache.*KVET_CACHE"):
        ModelSettings(SMOLLM2_ALIAS).load()


def test_a_scorecard_of_a_folder_whose_rows_are_another_protocols_says_so(finished_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    rows = [{k: v for k, v in row.items() if k != "budget_label"} for row in read_rows(run)]
    (run / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert scorecard_of(tmp_path, run) == 2
    assert "are not LongBench rows" in one_line_error(capsys)


def test_a_scorecard_of_a_run_still_writing_says_it_is_partial(finished_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    record = json.loads((run / "run.json").read_text())
    record["sessions"][-1]["finished"] = False
    (run / "run.json").write_text(json.dumps(record))
    assert scorecard_of(tmp_path, run) == 0
    assert f"Partial: {run} had not finished" in (tmp_path / "card" / "scorecard.md").read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["longbench", "--device", "meta"], "--device meta: a meta device runs no model"),
        (["longbench", "--presses", "snapkv(**{'window_size': 4})", "--dry-run"], "is not allowed"),
        (["locomo", "--presses", "rmm(lag=300)", "--budgets", "256", "--dry-run"], "use a lag below 256"),
    ],
)
def test_settings_known_before_the_model_are_refused_in_one_line(tmp_path, capsys, argv, message):
    assert main([*argv, "--model", str(tmp_path / "absent"), "--output", str(tmp_path / "run")]) == 2
    assert message in one_line_error(capsys)


@pytest.mark.parametrize(
    ("benchmark", "row", "message"),
    [
        ("longbench", {"task": "nope", "prediction": "a", "answers": ["a"]}, "line 1: no LongBench metric"),
        ("longbench", {"task": "trec", "prediction": "a", "answers": []}, "line 1: an empty answers list"),
        ("locomo", {"category": "abc", "prediction": "a", "answer": "a"}, "line 1: category 'abc' is not"),
        ("locomo", {"category": 9, "prediction": "a", "answer": "a"}, "line 1: unknown LoCoMo category 9"),
    ],
)
def test_rescoring_a_bad_line_names_it(tmp_path, capsys, benchmark, row, message):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert main(["score", benchmark, str(path)]) == 2
    assert message in one_line_error(capsys)


@pytest.mark.parametrize(
    ("errno_name", "message"),
    [("ENOSPC", "the disk is full"), ("EACCES", "cannot write")],
)
def test_a_write_the_machine_refuses_is_one_line_that_says_the_rerun_resumes(
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    capsys,
    monkeypatch,
    errno_name,
    message,
):
    import errno

    from evaluation.runs.store import ResultStore

    def refuse(self, row):
        raise OSError(getattr(errno, errno_name), "refused by this test", str(self.path))

    monkeypatch.setattr(ResultStore, "append", refuse)
    assert longbench(model_dir, data_dir, tmp_path / "run", "--tasks", "trec", "--n", "1") == 2
    error = one_line_error(capsys)
    assert message in error and "predictions.jsonl" in error


def test_every_error_the_cli_raises_reaches_the_user_as_one_line(monkeypatch, capsys):
    """Walks every ``raise EvaluationError(...)`` in evaluation/: no message's own text holds a line break, and
    the command line prints any message (one quoting a several-line inner error too) as one line, exit 2."""
    import ast

    import evaluation
    import evaluation.cli.main as cli
    from evaluation.errors import EvaluationError

    root = Path(evaluation.__file__).parent
    raises = 0
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            call = node.exc if isinstance(node, ast.Raise) else None
            if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "EvaluationError":
                raises += 1
                texts = [n.value for n in ast.walk(call) if isinstance(n, ast.Constant)]
                assert not [t for t in texts if isinstance(t, str) and "\n" in t], f"{path}:{node.lineno}"
    assert raises > 100

    def fail(args):
        raise EvaluationError("first line\n  an inner error's detail:\n  second")

    monkeypatch.setattr(cli, "run_protocol", fail)
    assert main(["locomo", "--dry-run"]) == 2
    assert one_line_error(capsys) == "error: first line; an inner error's detail:; second"


def test_ray_address_auto_without_a_cluster_is_one_line(model_dir, data_dir, tmp_path, capsys, monkeypatch):  # noqa: F811
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    argv = ["--tasks", "trec", "--n", "1", "--backend", "ray", "--ray-address", "auto"]
    assert longbench(model_dir, data_dir, tmp_path / "run", *argv) == 2
    assert "--ray-address auto: no Ray cluster answers" in one_line_error(capsys)
