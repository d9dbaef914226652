"""Runs stay correct under concurrency, crashes and bad input: each case of the reliability issue, on tiny
models and generated data, seconds each."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pytest

import evaluation.engine.serving as runner
from evaluation.cli.main import main
from evaluation.runs.models import ModelSettings
from tests.helpers import SHARED_DATA, without_progress
from tests.test_locomo_protocol import CONVERSATION
from tests.test_longbench_protocol import data_dir, longbench, model_dir  # noqa: F401


def rows_of(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]


def error_of(capsys) -> str:
    """What stderr says besides the run's progress lines (each timestamped)."""
    return without_progress(capsys.readouterr().err)


def test_a_second_run_into_the_same_folder_is_refused_while_the_first_writes(model_dir, data_dir, tmp_path, capsys):  # noqa: F811
    output = tmp_path / "run"
    output.mkdir()
    with (output / ".lock").open("a") as writer:  # what a run in another process holds
        fcntl.flock(writer, fcntl.LOCK_EX)
        assert longbench(model_dir, data_dir, output) == 2
        assert "another run is writing to" in error_of(capsys)
        assert not (output / "predictions.jsonl").exists()
    assert longbench(model_dir, data_dir, output, "--n", "1") == 0, "the lock ends with its holder"


def test_run_json_is_written_before_the_first_cell(model_dir, data_dir, tmp_path, monkeypatch):  # noqa: F811
    import evaluation.protocols.loop as loop

    output = tmp_path / "run"

    def crash(*args, **kwargs):
        record = json.loads((output / "run.json").read_text())
        assert (
            record["sessions"][0]["finished"] is False
            and "multi_news.jsonl" not in record["config"]["data_fingerprint"]
        )
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "run_units", crash)
    assert longbench(model_dir, data_dir, output) == 130, "Ctrl-C: one line and exit status 130"


def test_a_resume_with_other_settings_or_data_is_refused(model_dir, data_dir, tmp_path, capsys):  # noqa: F811
    output = tmp_path / "run"
    assert longbench(model_dir, data_dir, output, "--n", "1") == 0
    assert longbench(model_dir, data_dir, output, "--n", "1", "--max-length", "128") == 2
    assert "max_length: stored None, asked 128" in error_of(capsys)
    lengths = data_dir / "config" / "dataset2maxlen.json"
    lengths.write_text(json.dumps({"hotpotqa": 16, "trec": 4}))
    assert longbench(model_dir, data_dir, output, "--n", "1") == 2
    assert "data_fingerprint" in error_of(capsys)
    sessions = json.loads((output / "run.json").read_text())["sessions"]
    assert len(sessions) == 1 and sessions[0]["finished"], "refused resumes add no session"


def test_a_cell_a_press_cannot_run_is_recorded_and_the_grid_goes_on(model_dir, data_dir, tmp_path):  # noqa: F811
    output = tmp_path / "run"
    presses = ("--presses", "full", "snapkv(window_size=5000)", "tova")
    assert longbench(model_dir, data_dir, output, *presses) == 0
    rows = rows_of(output)
    failed = [row for row in rows if row.get("error")]
    assert {row["press"] for row in failed} == {"snapkv(window_size=5000)"}
    assert all("window" in row["error"] for row in failed), "the reason is the press's own"
    assert len(rows) == 2 * 2 * (1 + 2 * 2), "every other cell of every example ran"
    scorecard = (output / "scorecard.md").read_text()
    assert "failed (2)" in scorecard
    assert longbench(model_dir, data_dir, output, *presses) == 0
    assert rows_of(output) == rows, "failed cells are not retried"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--max-length", "-5"], "argument --max-length: -5 is below 16"),
        (["--max-length", "0"], "argument --max-length: 0 is below 16"),
        (["--n", "-1"], "argument --n: -1 is below 1"),
        (["--n", "0"], "argument --n: 0 is below 1"),
        (["--ratios", "1.5"], "argument --ratios: 1.5 is outside [0, 1)"),
        (["--budgets", "abc"], "argument --budgets: 'abc' is not a whole number"),
    ],
)
def test_bad_numbers_are_refused_when_parsed(model_dir, data_dir, tmp_path, capsys, arguments, message):  # noqa: F811
    assert longbench(model_dir, data_dir, tmp_path / "run", *arguments) == 2
    assert message in error_of(capsys)
    assert not (tmp_path / "run").exists(), "nothing ran"


@pytest.mark.parametrize("flag", ["--max-turns", "--max-new-tokens"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_bad_locomo_numbers_are_refused_when_parsed(tmp_path, capsys, flag, value):
    assert main(["locomo", "--data", str(tmp_path / "absent.json"), flag, value]) == 2
    assert f"argument {flag}: {value} is below 1" in error_of(capsys)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"hotpotqa": 0, "trec": 4}, "dataset2maxlen.json: the hotpotqa answer length must be a whole number"),
        ({"hotpotqa": "abc", "trec": 4}, "must be a whole number of tokens >= 1, not a string ('abc')"),
    ],
)
def test_bad_answer_lengths_in_the_config_are_refused(model_dir, data_dir, tmp_path, capsys, config, message):  # noqa: F811
    (data_dir / "config" / "dataset2maxlen.json").write_text(json.dumps(config))
    assert longbench(model_dir, data_dir, tmp_path / "run") == 2
    assert message in error_of(capsys)


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (
            lambda d: (d / "config" / "dataset2prompt.json").write_text("{not json"),
            "dataset2prompt.json: not a readable JSON",
        ),
        (
            lambda d: (d / "config" / "dataset2prompt.json").write_text(
                json.dumps({"hotpotqa": "{context} {nosuch}", "trec": "{context}{input}"})
            ),
            "has a field other than {context} and {input}",
        ),
        (
            lambda d: (d / "hotpotqa.jsonl").write_bytes(b'{"input": "\xff\xfe"}\n'),
            "hotpotqa.jsonl: not a readable JSON",
        ),
        (lambda d: (d / "hotpotqa.jsonl").write_text(""), "hotpotqa.jsonl"),
        (lambda d: replace_field(d, "answers", "just a string"), "answers must be a list of strings"),
        (lambda d: replace_field(d, "_id", "same"), "repeats the _id same"),
    ],
)
def test_bad_data_is_a_one_line_error(model_dir, data_dir, tmp_path, capsys, breakage, message):  # noqa: F811
    breakage(data_dir)
    assert longbench(model_dir, data_dir, tmp_path / "run") == 2
    error = error_of(capsys)
    assert message in error and "\n" not in error


def replace_field(folder: Path, field: str, value: object) -> None:
    path = folder / "hotpotqa.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**row, field: value}) + "\n" for row in rows))


def test_an_unwritable_output_fails_before_the_model_loads(data_dir, tmp_path, capsys):  # noqa: F811
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    absent_model = str(tmp_path / "no-model-here")
    for output in (blocker, blocker / "under"):
        assert longbench(absent_model, data_dir, output) == 2
        error = error_of(capsys)
        assert f"cannot write to {output}" in error and "cannot load model" not in error


def test_a_truncated_model_is_a_clear_error(model_dir, data_dir, tmp_path, capsys):  # noqa: F811
    broken = tmp_path / "broken-model"
    broken.mkdir()
    for path in model_dir.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert longbench(broken, data_dir, tmp_path / "run") == 2
    assert f"cannot load model {str(broken)!r}" in error_of(capsys)


@pytest.mark.parametrize("device", ["banana", "cuda"])
def test_a_device_this_machine_lacks_is_refused(model_dir, data_dir, tmp_path, capsys, device):  # noqa: F811
    assert longbench(model_dir, data_dir, tmp_path / "run", "--device", device) == 2
    error = error_of(capsys)
    assert "--device" in error and device in error and "\n" not in error


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda qa: qa.__setitem__(0, {**qa[0], "category": 9}), "has category 9; LoCoMo's are 1 to 5"),
        (lambda qa: qa[1].pop("answer"), "has no answer to score against"),
    ],
)
def test_bad_locomo_questions_are_refused(tmp_path, capsys, change, message):
    conversation = json.loads(json.dumps(CONVERSATION))
    change(conversation["qa"])
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps([conversation]))
    assert main(["locomo", "--data", str(path), "--output", str(tmp_path / "run"), "--dry-run"]) == 2
    assert message in error_of(capsys)


def test_the_trace_cache_is_keyed_by_the_data(tmp_path, monkeypatch):
    """Two data roots with different multi_news:0 texts give two cached traces, not the first one twice."""
    from evaluation.protocols.traces.record import load_or_record

    monkeypatch.setenv("KVET_CACHE", str(tmp_path / "cache"))
    roots = []
    for name, text in (("one", "alpha beta gamma " * 60), ("two", "delta epsilon zeta " * 60)):
        root = tmp_path / name / "longbench"
        root.mkdir(parents=True)
        row = {"input": "", "context": text, "answers": ["x"], "all_classes": None, "length": 1, "dataset": "m"}
        (root / "multi_news.jsonl").write_text(json.dumps({**row, "language": "en", "_id": "0"}) + "\n")
        roots.append(root.parent)
    from tests.helpers import byte_tokenizer, tiny_model

    model, tokenizer = tiny_model("llama", "sdpa", vocab_size=260), byte_tokenizer()
    first, second = (load_or_record(lambda: (model, tokenizer), "tiny", "multi_news:0", 80, False, r) for r in roots)
    assert first.token_ids != second.token_ids
    assert len(list((tmp_path / "cache" / "traces").iterdir())) == 2


def test_a_corrupt_trace_cache_names_its_file(tmp_path, monkeypatch, capsys):
    from evaluation.protocols.traces.record import load_or_record

    monkeypatch.setenv("KVET_CACHE", str(tmp_path / "cache"))
    from tests.helpers import byte_tokenizer, tiny_model

    model, tokenizer = tiny_model("llama", "sdpa", vocab_size=260), byte_tokenizer()
    load_or_record(lambda: (model, tokenizer), "tiny", "multi_news:0", 80, False, SHARED_DATA)
    cached = next((tmp_path / "cache" / "traces").iterdir())
    cached.write_bytes(b"torn")
    from evaluation.errors import EvaluationError

    with pytest.raises(EvaluationError, match=f"the trace cache file {cached} is unreadable"):
        load_or_record(lambda: (model, tokenizer), "tiny", "multi_news:0", 80, False, SHARED_DATA)


def test_model_settings_default_is_the_offline_model():
    assert ModelSettings().name == "smollm2-135m"


def test_an_error_that_is_no_refusal_stops_the_run_loudly_and_the_rerun_resumes(
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
):
    """Out of memory in the second example: no failed cell, an exit status of 2 and a message naming the unit; the
    first example's rows stay, and the same command finishes the rest."""
    import torch

    output, calls, decode = tmp_path / "run", [], runner.decode_batch_forced

    def out_of_memory_on_the_second_example(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return decode(*args, **kwargs)

    monkeypatch.setattr(runner, "decode_batch_forced", out_of_memory_on_the_second_example)
    assert longbench(model_dir, data_dir, output) == 2
    message = error_of(capsys)
    assert "the run stopped in" in message and "OutOfMemoryError: CUDA out of memory" in message
    assert "the same command resumes" in message and "\n" not in message
    first = rows_of(output)
    assert first and not any(row.get("error") for row in first), "nothing is recorded as a failed cell"
    monkeypatch.setattr(runner, "decode_batch_forced", decode)
    assert longbench(model_dir, data_dir, output) == 0
    assert rows_of(output)[: len(first)] == first
    sessions = json.loads((output / "run.json").read_text())["sessions"]
    assert not sessions[0]["finished"] and sessions[1]["units_run"] == 3, "2 tasks x 2 examples, 1 done before"


def test_a_session_cut_off_keeps_the_time_of_the_units_it_finished(model_dir, data_dir, tmp_path, monkeypatch):  # noqa: F811
    """A session that never reaches its end (killed; here interrupted in its second example) has recorded each
    finished example's seconds and its wall time so far in run.json as each finished."""
    output, calls, decode = tmp_path / "run", [], runner.decode_batch_forced

    def interrupted_in_the_second_example(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return decode(*args, **kwargs)

    monkeypatch.setattr(runner, "decode_batch_forced", interrupted_in_the_second_example)
    assert longbench(model_dir, data_dir, output) == 130
    session = json.loads((output / "run.json").read_text())["sessions"][0]
    assert not session["finished"] and session["units_run"] == 1 and len(session["unit_seconds"]) == 1
    assert session["wall_seconds"] >= next(iter(session["unit_seconds"].values())) > 0


def test_an_eager_prefill_that_would_not_fit_is_refused_before_it_runs(monkeypatch):
    """H2O's eager weights over a long prompt on a machine without the memory: refused with the length and the
    bytes, before anything is computed (``MemoryRefusal``: the run stops, no row is stored; tests/test_cell_errors.py
    runs it through a run)."""
    import psutil
    import torch

    from evaluation.catalogue.resolved import make_press
    from evaluation.engine.decoding import generate
    from evaluation.errors import MemoryRefusal
    from tests.helpers import tiny_model

    model = tiny_model("llama", "eager")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("Memory", (), {"available": 10_000})())
    with pytest.raises(
        MemoryRefusal, match=r"eager attention over 96 tokens needs 294,912 bytes .* and 10,000 are free"
    ):
        generate(
            model,
            torch.ones(1, 96, dtype=torch.long),
            torch.ones(1, 2, dtype=torch.long),
            make_press("h2o", 0.5),
            4,
            set(),
        )
