"""The ruler, needle and kvpress protocols end to end on a tiny model: each cell's prediction is what KVPress's own
pipeline generates for the exported example under the same press, the rows name their length and depth, the
exported parquet is KVPress's columns, the same command twice gives the same predictions, the kvpress protocol reads
the export back to the same rows, and KVPress's evaluate_config.yaml runs as is."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from kvpress import SnapKVPress
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

from evaluation.cli.main import main
from evaluation.protocols.kvpress.columns import COLUMNS
from evaluation.protocols.ruler.card import ratios_of
from tests.helpers import saved_chat_model

TASKS = ["niah_single_1", "niah_multikey_1", "qa_1"]
LENGTH = "1400"  # a byte-level tokenizer: a token per character


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return saved_chat_model(tmp_path_factory.mktemp("tiny-llama"), "llama", context=2048)


def rows_of(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]


def ruler(model_dir: Path, output: Path, *extra: str) -> int:
    argv = ["ruler", "--model", str(model_dir), "--tasks", *TASKS, "--lengths", LENGTH, "--n", "2"]
    return main([*argv, "--presses", "full", "snapkv", "tova", "--ratios", "0.5", "--output", str(output), *extra])


@pytest.fixture(scope="module")
def ruler_run(model_dir, tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("ruler")
    assert ruler(model_dir, folder / "run", "--export", str(folder / "examples.parquet")) == 0
    return folder / "run", folder / "examples.parquet"


def test_each_cell_is_kvpress_pipelines_own_generation(model_dir, ruler_run):
    output, exported = ruler_run
    examples = pd.read_parquet(exported).set_index("id")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=AutoTokenizer.from_pretrained(model_dir))
    presses = {"full": None, "snapkv": SnapKVPress(compression_ratio=0.5)}
    checked = 0
    for row in rows_of(output):
        if row["press"] not in presses:
            continue
        example = examples.loc[row["id"]]
        answer = pipe(
            example["context"],
            question=example["question"],
            answer_prefix=example["answer_prefix"],
            press=presses[row["press"]],
            max_new_tokens=int(example["max_new_tokens"]),
        )["answer"]
        assert row["prediction"] == answer, (row["id"], row["press"])
        checked += 1
    assert checked == 2 * len(TASKS) * 2


def test_rows_name_their_length_and_depth_and_the_scorecard_its_categories(ruler_run):
    output, _ = ruler_run
    rows = rows_of(output)
    assert len(rows) == len(TASKS) * 2 * 3
    assert {row["length"] for row in rows} == {int(LENGTH)}
    niah = [row for row in rows if row["task"].startswith("niah")]
    assert all(0 <= row["depth"] <= 1 for row in niah)
    assert all(row["depth"] is None for row in rows if row["task"] == "qa_1")
    card = (output / "scorecard.md").read_text()
    assert "RULER's categories" in card and "retrieval @ 1400" in card and "average @ 1400" in card
    assert (output / "leaderboard.png").stat().st_size > 0


def test_the_export_has_kvpress_columns(ruler_run):
    output, exported = ruler_run
    frame = pd.read_parquet(exported)
    assert set(COLUMNS) <= set(frame.columns) and len(frame) == len(TASKS) * 2
    assert set(frame["task"]) == set(TASKS) and set(frame["max_new_tokens"]) == {128, 32}
    assert all(len(answer) >= 1 for answer in frame["answer"])
    assert {row["id"] for row in rows_of(output)} == set(frame["id"])


def test_the_same_command_gives_the_same_predictions(model_dir, ruler_run, tmp_path):
    output, _ = ruler_run
    assert ruler(model_dir, tmp_path / "again") == 0
    first = {(r["id"], r["press"], r["budget"]): r["prediction"] for r in rows_of(output)}
    assert {(r["id"], r["press"], r["budget"]): r["prediction"] for r in rows_of(tmp_path / "again")} == first


def test_the_kvpress_protocol_reads_the_export_back_to_the_same_rows(model_dir, ruler_run, tmp_path):
    output, exported = ruler_run
    argv = ["kvpress", "--dataset", "ruler", "--data", str(exported), "--model", str(model_dir)]
    argv += ["--presses", "full", "snapkv", "tova", "--ratios", "0.5", "--output", str(tmp_path / "kv")]
    assert main(argv) == 0

    def cells(rows: list[dict]) -> dict:
        return {(r["id"], r["press"], r["budget"]): (r["prediction"], r["score"]) for r in rows}

    assert cells(rows_of(tmp_path / "kv")) == cells(rows_of(output))

    def likelihoods(rows: list[dict]) -> dict:
        return {(r["id"], r["press"], r["budget"]): (r["length"], r["depth"], r["answer_nll"]) for r in rows}

    assert likelihoods(rows_of(tmp_path / "kv")) == likelihoods(rows_of(output))


def test_the_needle_runs_at_each_depth_and_length_and_draws_its_heatmaps(model_dir, tmp_path):
    argv = ["needle", "--model", str(model_dir), "--lengths", "600", "900", "--depths", "0", "50", "100"]
    assert main([*argv, "--presses", "full", "snapkv", "--ratios", "0.5", "--output", str(tmp_path / "n")]) == 0
    rows = rows_of(tmp_path / "n")
    assert {(row["length"], row["depth"]) for row in rows} == {(a, d) for a in (600, 900) for d in (0, 0.5, 1)}
    assert (tmp_path / "n" / "heatmaps.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["kvpress", "--dataset", "ruler-128k"], "unknown KVPress dataset 'ruler-128k'"),
        (["kvpress", "--dataset", "ruler", "--data", "missing.parquet"], "missing.parquet not found"),
        (["needle", "--depths", "150"], "a depth is a percent of the context"),
        (["kvpress", "--dataset", "needle_in_haystack"], "run python -m evaluation needle"),
    ],
)
def test_bad_input_is_one_line_before_the_model(argv, message, capsys, tmp_path):
    assert main([*argv, "--output", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0]


def test_kvpress_evaluate_config_runs_as_is(capsys):
    """KVPress's shipped config (RULER at 4096 tokens, knorm at 0.5; its model a hub id, replaced here)."""
    config = Path(__file__).parent / "data" / "kvpress_evaluate_config.yaml"
    assert main(["ruler", "--config", str(config), "--dry-run", "--model", "smollm2-135m"]) == 0
    plan = capsys.readouterr().out
    assert "at 4096 tokens" in plan and "knorm @ keep 50%" in plan


def test_the_leaderboard_places_a_token_budget_at_each_lengths_own_ratio():
    """A token budget keeps 512 of 1,024 tokens (ratio 0.5) and 512 of 4,096 (0.875): one x per length."""
    rows = [
        {"press": "snapkv", "budget_label": "512 tokens", "length": length, "compression_ratio": ratio}
        for length, ratio in ((1024, 0.5), (1024, 0.5), (4096, 0.875))
    ]
    ratios = ratios_of([*rows, {"press": "full", "budget_label": "full", "length": 1024, "compression_ratio": 0.0}])
    assert ratios == {(1024, "512 tokens"): 0.5, (4096, "512 tokens"): 0.875}
