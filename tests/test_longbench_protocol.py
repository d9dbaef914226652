"""The LongBench protocol end to end on a tiny random model and generated data, plus its error messages."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from kvpress.utils import compute_n_kept

from evaluation.cli.main import main
from evaluation.protocols.longbench.data import Example, TaskConfig, load_task, parquet_rows, write_jsonl
from evaluation.protocols.longbench.prompts import build_prompt
from evaluation.runs.json_rows import load_json_rows
from tests.helpers import CHAT_TEMPLATE, SHARED_DATA, byte_tokenizer, saved_chat_model

PROMPTS = {
    "hotpotqa": "Read the passages.\n\n{context}\n\nQuestion: {input}\nAnswer:",
    "trec": "Classify the question. Examples:\n\n{context}\n{input}",
}
MAX_NEW_TOKENS = {"hotpotqa": 6, "trec": 4}
PRESSES = ["full", "snapkv", "h2o", "tova", "rmm"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama with a byte-level tokenizer that has a chat template, saved like a hub model."""
    return saved_chat_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


def write_task(folder: Path, task: str, n: int, seed: int) -> None:
    rng = random.Random(seed)
    words = ["amber", "river", "stone", "lantern", "orchid", "harbor", "meadow", "falcon"]
    with (folder / f"{task}.jsonl").open("w") as handle:
        for i in range(n):
            context = " ".join(rng.choice(words) for _ in range(60))
            row = {
                "input": f"Which word comes first in passage {i}?",
                "context": context,
                "answers": [context.split()[0]],
                "all_classes": ["Location", "Entity"] if task == "trec" else None,
                "length": 60,
                "dataset": task,
                "language": "en",
                "_id": f"{task}-{i}",
            }
            handle.write(json.dumps(row) + "\n")


@pytest.fixture
def data_dir(tmp_path) -> Path:
    folder = tmp_path / "longbench"
    (folder / "config").mkdir(parents=True)
    (folder / "config" / "dataset2prompt.json").write_text(json.dumps(PROMPTS))
    (folder / "config" / "dataset2maxlen.json").write_text(json.dumps(MAX_NEW_TOKENS))
    write_task(folder, "hotpotqa", 3, seed=0)
    write_task(folder, "trec", 3, seed=1)
    return folder


def longbench(model_dir: Path, data_dir: Path, output: Path, *extra: str) -> int:
    return main(
        [
            "longbench",
            "--model",
            str(model_dir),
            "--data",
            str(data_dir),
            "--tasks",
            "hotpotqa",
            "trec",
            "--presses",
            *PRESSES,
            "--ratios",
            "0.5",
            "--budgets",
            "100",
            "--n",
            "2",
            "--output",
            str(output),
            *extra,
        ]
    )


def read_rows(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]


def test_the_whole_grid_runs_resumes_and_repeats_itself(model_dir, data_dir, tmp_path):
    output = tmp_path / "run"
    assert longbench(model_dir, data_dir, output) == 0
    rows = read_rows(output)
    assert len(rows) == 2 * 2 * (1 + 4 * 2), "2 tasks x 2 examples x (full + 4 presses x 2 budgets)"
    for row in rows:
        assert row["question_tokens"] > 0 and not row["query_aware"]
        assert row["attn_implementation"] == "sdpa" and row["path"] == "shared"
        if row["budget"] == "ratio=0.5":
            assert row["kept_tokens"] == compute_n_kept(row["context_tokens"], 0.5)
        elif row["budget"] == "tokens=100":
            assert row["kept_tokens"] == 100 < row["context_tokens"]
        else:
            assert row["kept_tokens"] == row["context_tokens"] and row["compression_ratio"] == 0
    for name in ("scorecard.md", "scorecard.csv", "scorecard.png", "run.json"):
        assert (output / name).stat().st_size > 0
    scorecard = (output / "scorecard.md").read_text()
    assert "| hotpotqa | keep 50% |" in scorecard and "| average | 100 tokens |" in scorecard
    assert "| hotpotqa | keep 50% | snapkv | 2 |" in scorecard.split("## Generations at the cap")[1]
    assert "## Against the full cache" in scorecard
    record = json.loads((output / "run.json").read_text())
    assert record["config"]["model"] == str(model_dir) and record["sessions"][0]["units_run"] == 4
    seconds = record["sessions"][0]["unit_seconds"]
    assert set(seconds) == {f"{row['task']}/{row['id']}" for row in rows}, "each example's cost"
    assert all(s > 0 for s in seconds.values())
    assert {"torch", "transformers", "kvpress"} <= set(record["sessions"][0]["versions"])

    # resume after an interruption: the last 5 cells lost, and a line torn in the middle of its write
    lines = (output / "predictions.jsonl").read_text().splitlines(keepends=True)
    (output / "predictions.jsonl").write_text("".join(lines[:-5]) + lines[-5][:40])
    assert longbench(model_dir, data_dir, output) == 0
    resumed = read_rows(output)
    assert [r["prediction"] for r in resumed] == [r["prediction"] for r in rows], "same predictions, same order"
    assert json.loads((output / "run.json").read_text())["sessions"][1]["units_run"] == 1, "only the last example"

    assert longbench(model_dir, data_dir, output) == 0
    assert len(read_rows(output)) == len(rows), "a finished run reruns nothing"


def test_query_aware_compresses_the_whole_prompt(model_dir, data_dir, tmp_path):
    output = tmp_path / "aware"
    assert longbench(model_dir, data_dir, output, "--query-aware", "--n", "1", "--presses", "h2o", "rmm") == 0
    assert all(row["question_tokens"] == 0 and row["query_aware"] for row in read_rows(output))


def test_a_decoding_press_runs_beside_its_prefill_press_in_one_scorecard(model_dir, data_dir, tmp_path):
    """``decoding(tova, ...)`` (TOVA's multi-state RNN) takes the per-cell path: the context prefilled whole, the
    cache compressed while the answer is generated; prefill TOVA shares the prefill."""
    output, decoding = tmp_path / "decoding", "decoding(tova,compression_interval=1)"
    arguments = ("--tasks", "hotpotqa", "--n", "1", "--presses", "full", "tova", decoding)
    assert longbench(model_dir, data_dir, output, *arguments) == 0
    rows = {(row["press"], row["budget"]): row for row in read_rows(output)}
    assert rows[(decoding, "ratio=0.5")]["path"] == "per-cell"
    assert rows[("tova", "ratio=0.5")]["path"] == "shared"
    context = rows[(decoding, "ratio=0.5")]["context_tokens"]
    assert rows[(decoding, "ratio=0.5")]["kept_tokens"] == context, "the prefill is not compressed"
    record = json.loads((output / "run.json").read_text())
    assert record["config"]["paths"][decoding] == "compresses while decoding (per-cell path)"
    header = next(line for line in (output / "scorecard.md").read_text().splitlines() if line.startswith("| condition"))
    assert f"| tova | {decoding} |" in header


def test_resuming_with_other_settings_is_refused(model_dir, data_dir, tmp_path, capsys):
    output, narrow = tmp_path / "run", ("--tasks", "trec", "--presses", "full", "--n", "1")
    assert longbench(model_dir, data_dir, output, *narrow) == 0
    assert longbench(model_dir, data_dir, output, *narrow, "--query-aware") == 2
    assert "query_aware: stored False, asked True" in capsys.readouterr().err


def test_prompt_split_and_middle_truncation():
    tokenizer = byte_tokenizer(CHAT_TEMPLATE)
    example = Example("hotpotqa", "x", "Who?", "alpha beta gamma " * 20, ["alpha"], None)
    config = TaskConfig(PROMPTS["hotpotqa"], 6)
    prompt = build_prompt(example, config, tokenizer, max_length=10_000, query_aware=False)
    context = tokenizer.decode(prompt.context_ids[0])
    question = tokenizer.decode(prompt.question_ids[0])
    assert context.startswith("<s>user: Read the passages.") and context.endswith("alpha beta gamma ")
    assert question == "\n\nQuestion: Who?\nAnswer:</s><s>assistant: "
    assert not prompt.truncated

    short = build_prompt(example, config, tokenizer, max_length=120, query_aware=True)
    text = tokenizer.decode(short.context_ids[0])
    assert short.truncated and short.question_ids.shape[1] == 0
    assert text.startswith("<s>user: Read the passages.") and text.endswith("Question: Who?\nAnswer:</s><s>assistant: ")
    assert len(tokenizer.encode(text, add_special_tokens=False)) < 120 + 30

    raw = build_prompt(
        Example("trec", "y", "Where?", "ctx " * 5, ["Location"], ["Location"]),
        TaskConfig(PROMPTS["trec"], 4),
        tokenizer,
        10_000,
        False,
    )
    assert torch.equal(raw.question_ids, torch.tensor([tokenizer.encode("\nWhere?")])), "no chat template for trec"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--tasks", "nosuchtask"], "unknown LongBench task(s) ['nosuchtask']; known tasks: narrativeqa"),
        (["--presses", "nosuchpress"], "press spec 'nosuchpress': unknown press 'nosuchpress'; known: AdaKVPress"),
        (["--ratios", "1.0"], "argument --ratios: 1.0 is outside [0, 1)"),
        (["--ratios", "-0.2"], "argument --ratios: -0.2 is outside [0, 1)"),
        (["--budgets", "0"], "argument --budgets: 0 is below 1"),
        (["--data", "/nonexistent/longbench"], "LongBench data dir /nonexistent/longbench is missing"),
        (["--tasks", "qasper"], "qasper.jsonl not found; this data dir holds the tasks ['hotpotqa', 'trec']"),
        (["--model", "/nonexistent/model"], "cannot load model '/nonexistent/model'"),
    ],
)
def test_bad_input_gets_a_clear_error(model_dir, data_dir, tmp_path, capsys, arguments, message):
    base = {"--model": str(model_dir), "--data": str(data_dir), "--tasks": "hotpotqa", "--n": "1"}
    for flag, value in zip(arguments[::2], arguments[1::2], strict=True):
        base[flag] = value
    if "qasper" in arguments:
        (data_dir / "config" / "dataset2prompt.json").write_text(json.dumps({**PROMPTS, "qasper": "{context}{input}"}))
        (data_dir / "config" / "dataset2maxlen.json").write_text(json.dumps({**MAX_NEW_TOKENS, "qasper": 4}))
    argv = ["longbench", "--output", str(tmp_path / "out"), *[item for pair in base.items() for item in pair]]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_malformed_jsonl_line_is_reported_with_its_file(model_dir, data_dir, tmp_path, capsys):
    path = data_dir / "hotpotqa.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], '{"input": "broken', *lines[1:]]) + "\n")
    assert longbench(model_dir, data_dir, tmp_path / "out", "--tasks", "hotpotqa", "--n", "3") == 2
    assert f"{path}: not a readable JSON file" in capsys.readouterr().err


def test_no_data_dir_and_no_hub_says_what_to_pass(tmp_path, capsys, monkeypatch, no_shared_data):
    def unreachable(*_: object) -> None:
        raise ConnectionError("no network")

    monkeypatch.setattr("evaluation.protocols.longbench.data.parquet_rows", unreachable)
    monkeypatch.setenv("KVET_CACHE", str(tmp_path / "cache"))
    assert main(["longbench", "--output", str(tmp_path / "out"), "--n", "1"]) == 2
    error = capsys.readouterr().err
    assert "no LongBench data: no --data, KVET_SHARED_DATA or shared/data was found, and downloading THUDM" in error
    assert "ConnectionError: no network" in error and "Pass --data " in error


@pytest.mark.parametrize("layout", ["{task}/test/0000.parquet", "{task}/longbench-test.parquet"])
def test_the_hub_parquet_copy_gives_the_official_rows(tmp_path, layout):
    import datasets

    official = SHARED_DATA / "longbench"
    rows = load_json_rows(official / "multi_news.jsonl")
    copy = tmp_path / "hub" / layout.format(task="multi_news")
    copy.parent.mkdir(parents=True)
    datasets.Dataset.from_list(rows).to_parquet(str(copy))
    converted = tmp_path / "converted"
    (converted / "config").mkdir(parents=True)
    write_jsonl(converted / "multi_news.jsonl", parquet_rows(str(tmp_path / "hub"), "multi_news", None))
    assert load_task(converted, "multi_news") == load_task(official, "multi_news")
    assert (converted / "multi_news.jsonl").read_text().splitlines() == [
        json.dumps(row, ensure_ascii=False) for row in rows
    ]


def test_a_run_into_a_log_writes_no_progress_redraws(model_dir, data_dir, tmp_path):
    import subprocess
    import sys

    arguments = ["--model", str(model_dir), "--data", str(data_dir), "--tasks", "hotpotqa", "trec", "--n", "2"]
    command = [sys.executable, "-m", "evaluation", "longbench", *arguments, "--output", str(tmp_path / "out")]
    log = subprocess.run(command, capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1])
    output = log.stdout + log.stderr
    assert "\r" not in output and "Loading weights" not in output
    progress = log.stderr.splitlines()
    assert len(progress) <= 7 + 2 * 4, "a few lines a run, two an example: " + log.stderr
    assert progress == (tmp_path / "out" / "progress.log").read_text().splitlines(), "the log holds the same lines"
    assert log.stdout.splitlines() == [f"scorecard: {tmp_path / 'out' / 'scorecard.md'}"]


def test_one_data_rule_data_then_the_variable_then_shared_data_then_the_hub(tmp_path, monkeypatch):
    """``--data`` first, then ``$KVET_SHARED_DATA``, then ``shared/data`` inside, then beside the checkout, then
    the hub (None), for LongBench's folder and LoCoMo's file alike; a variable that holds neither is an error; the
    checkout's shared data that lacks an asked LongBench task leaves it to the hub."""
    from evaluation.errors import EvaluationError
    from evaluation.protocols.locomo.data import local_path
    from evaluation.protocols.longbench.data import local_data_dir
    from evaluation.runs.data_location import located

    checkout = tmp_path / "checkout"
    monkeypatch.setattr("evaluation.runs.data_location.CHECKOUT", checkout)
    monkeypatch.delenv("KVET_SHARED_DATA", raising=False)
    monkeypatch.setenv("KVET_CACHE", str(tmp_path / "cache"))
    places = {name: tmp_path / name / "data" for name in ("given", "variable")}
    places |= {"inside": checkout / "shared" / "data", "beside": tmp_path / "shared" / "data"}
    for root in places.values():
        (root / "longbench" / "config").mkdir(parents=True)
        for name in ("dataset2prompt.json", "dataset2maxlen.json"):
            (root / "longbench" / "config" / name).write_text("{}")
        (root / "longbench" / "hotpotqa.jsonl").write_text("")
        (root / "locomo").mkdir()
        (root / "locomo" / "locomo10.json").write_text("[]")

    def found() -> tuple[Path | None, Path | None]:
        return local_data_dir(None, ["hotpotqa"]), local_path(None)

    assert local_data_dir(str(places["given"] / "longbench"), []) == places["given"] / "longbench"
    monkeypatch.setenv("KVET_SHARED_DATA", str(places["variable"]))
    assert found() == (places["variable"] / "longbench", places["variable"] / "locomo" / "locomo10.json")
    monkeypatch.setenv("KVET_SHARED_DATA", str(tmp_path / "empty"))
    with pytest.raises(EvaluationError, match=r"KVET_SHARED_DATA=.*empty holds no longbench: pass --data"):
        located(None, "longbench")
    monkeypatch.delenv("KVET_SHARED_DATA")
    assert found() == (places["inside"] / "longbench", places["inside"] / "locomo" / "locomo10.json")
    assert local_data_dir(None, ["trec"]) is None, "a task the checkout's shared data lacks: the hub"
    shutil.rmtree(places["inside"])
    assert found() == (places["beside"] / "longbench", places["beside"] / "locomo" / "locomo10.json")
    shutil.rmtree(places["beside"])
    assert found() == (None, None), "the hub"


def test_max_new_tokens_caps_generation_and_is_recorded_as_a_departure(model_dir, data_dir, tmp_path, capsys):
    """``--max-new-tokens 3`` (below hotpotqa's 6 and trec's 4): each prediction is the one of data whose official
    length is 3, the answer likelihood the one at the official length, and the run, its dry run and its scorecard
    say so."""
    official, capped, short = tmp_path / "official", tmp_path / "capped", tmp_path / "short"
    assert longbench(model_dir, data_dir, official) == 0
    assert longbench(model_dir, data_dir, capped, "--max-new-tokens", "3") == 0
    three_tokens = Path(shutil.copytree(data_dir, tmp_path / "three-tokens"))
    (three_tokens / "config" / "dataset2maxlen.json").write_text(json.dumps(dict.fromkeys(MAX_NEW_TOKENS, 3)))
    assert longbench(model_dir, three_tokens, short) == 0

    def by_key(output: Path) -> dict[tuple, dict]:
        return {(r["task"], r["id"], r["press"], r["budget"]): r for r in read_rows(output)}

    reference, rows, three = by_key(official), by_key(capped), by_key(short)
    assert rows.keys() == reference.keys() == three.keys()
    assert any(r["generated_tokens"] > 3 for r in reference.values()), "the cap must cut something"
    for key, row in rows.items():
        assert row["generated_tokens"] == min(reference[key]["generated_tokens"], 3)
        assert row["prediction"] == three[key]["prediction"] and row["score"] == three[key]["score"]
        assert (row["answer_nll"], row["answer_tokens"]) == (
            reference[key]["answer_nll"],
            reference[key]["answer_tokens"],
        )
    assert any(row["answer_tokens"] > 3 for row in rows.values()), "the likelihood keeps the official length"
    assert json.loads((capped / "run.json").read_text())["config"]["max_new_tokens"] == 3
    departure = "Departure from LongBench's protocol: generation capped at 3 tokens (--max-new-tokens), below"
    assert f"**{departure} the official answer length (hotpotqa 6, trec 4)" in (capped / "scorecard.md").read_text()
    assert "Departure" not in (official / "scorecard.md").read_text()
    chosen = [r for r in rows.values() if (r["task"], r["budget"], r["press"]) == ("hotpotqa", "ratio=0.5", "snapkv")]
    at_cap = sum(r["generated_tokens"] == 3 for r in chosen) / len(chosen)
    assert f"| hotpotqa | keep 50% | snapkv | 2 | {at_cap:.0%} |" in (capped / "scorecard.md").read_text()

    capsys.readouterr()
    assert longbench(model_dir, data_dir, tmp_path / "dry", "--max-new-tokens", "5", "--dry-run") == 0
    plan = capsys.readouterr().out
    assert (
        f"at most {(2 * 5 + 2 * 4) * 9} answer tokens" in plan
        and "below the official answer length (hotpotqa 6);" in plan
    )
    assert longbench(model_dir, data_dir, tmp_path / "dry", "--max-new-tokens", "6", "--dry-run") == 0
    assert "Departure" not in capsys.readouterr().out, "no task is cut"


def test_an_older_run_without_max_new_tokens_resumes_at_the_official_length(model_dir, data_dir, tmp_path, capsys):
    output, narrow = tmp_path / "run", ("--tasks", "trec", "--presses", "full", "--n", "1")
    assert longbench(model_dir, data_dir, output, *narrow) == 0
    record = json.loads((output / "run.json").read_text())
    for config in (record["config"], *(session["config"] for session in record["sessions"])):
        del config["max_new_tokens"]  # as a run.json written before the option existed
    (output / "run.json").write_text(json.dumps(record))
    assert longbench(model_dir, data_dir, output, "--tasks", "trec", "--presses", "full", "--n", "2") == 0
    assert [row["id"] for row in read_rows(output)] == ["trec-0", "trec-1"], "resumed: the second example added"
    assert json.loads((output / "run.json").read_text())["config"]["max_new_tokens"] is None, "the official length"
    assert longbench(model_dir, data_dir, output, *narrow, "--max-new-tokens", "2") == 2
    assert "max_new_tokens: stored None, asked 2" in capsys.readouterr().err
