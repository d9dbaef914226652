"""docs/architecture.md's protocol example runs as written: registered, it is a subcommand with a dry run and a
run that resumes and writes its scorecard; nothing else in the harness changes for it. Every shipped protocol's
settings are declared once: a configuration's record rebuilds it through its options, and its work is registered
by importing its module."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from evaluation.cli.main import main, model_settings, parser_for_every_command
from evaluation.cli.reproduce import configured
from evaluation.protocols import protocol as registry
from evaluation.protocols.protocol import recorded
from evaluation.protocols.shipped import SHIPPED, protocols
from evaluation.protocols.shipped_work import IMPLEMENTED
from tests.test_longbench_protocol import model_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


def example_module(tmp_path: Path, monkeypatch):
    text = (ROOT / "docs" / "architecture.md").read_text()
    code = re.search(r"## Adding a protocol.*?```python\n(.*?)```", text, re.S).group(1)
    path = tmp_path / "my_protocol.py"
    path.write_text(code)
    monkeypatch.setattr(registry, "_REGISTRY", dict(protocols()))
    spec = importlib.util.spec_from_file_location("my_protocol", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(__import__("sys").modules, "my_protocol", module)
    spec.loader.exec_module(module)
    return module


def test_the_documented_protocol_is_one_module_and_its_registration(model_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    example_module(tmp_path, monkeypatch)
    assert "echo" in protocols()
    assert main(["echo", "--dry-run"]) == 0
    assert capsys.readouterr().out.strip().splitlines() == [
        "echo: 2 presses",
        "output: scratch/echo/smollm2-135m (a new run)",
    ]
    output = tmp_path / "run"
    assert main(["echo", "--model", str(model_dir), "--output", str(output)]) == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert [(row["press"], row["score"]) for row in rows] == [("full", 1.0), ("h2o", 1.0)]
    assert "Echo" in (output / "scorecard.md").read_text()
    record = json.loads((output / "run.json").read_text())
    pooled = ["dtype", "attn_implementation", "presses", "score"]
    assert record["protocol"] == "echo" and record["pooled_settings"] == pooled and record["config"]["score"] == 1.0
    assert main(["echo", "--model", str(model_dir), "--output", str(output)]) == 0, "a finished run resumes"
    assert len((output / "predictions.jsonl").read_text().splitlines()) == 2
    assert main(["echo", "--model", str(model_dir), "--output", str(tmp_path / "half"), "--score", "0.5"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "half" / "predictions.jsonl").read_text().splitlines()]
    assert [row["score"] for row in rows] == [0.5, 0.5], "the setting's option configures the run"


# every option whose setting is recorded under another name or form than the option's, at a value not its default
ASKED = {
    "longbench": "--data D --ratios 0.25 --budgets 64 --n 5 --query-aware --max-length 100 --max-new-tokens 3 "
    "--path per-cell --likelihood-only",
    "locomo": "--data f.json --conversations conv-1 --placement evidence --history model --budgets 90 --max-turns 3",
    "reuse": "--seed 3 --episodes 2 --sessions 4 --facts 3 --lag 2 --rmm-weights all --max-new-tokens 9",
    "multiquery": "--seed 1 --episodes 3 --lengths 1024 2048 --max-history-tokens 5000",
    "memory": "--budget-facts 4 --multiples 2 3 --reuse-every 3 --queries 1 --likelihood-only",
    "traces": "--data /d --texts locomo:conv-30 --length 100 --budgets 8 --per-kv-group --threshold 0.5 --h2o-window 0",
    "probe": "--seed 2 --probes 3 --no-reasoning --max-new-tokens 7 --gold-positions middle",
    "perplexity": "--data /d --texts --text-file a.txt --length 64 --budgets 32 --chunk 4 --cells-one-at-a-time",
    "ruler": "--tasks vt qa_1 --n 2 --lengths 256 --seed 1 --export x.parquet --budgets 16 --query-aware",
    "needle": "--depths 10 90 --lengths 512 --ratios 0.1 --path per-cell",
    "kvpress": "--dataset ruler --data x.jsonl --subset 4096 --n 3 --likelihood-only",
}


@pytest.mark.parametrize("name", SHIPPED)
def test_a_recorded_run_rebuilds_its_configuration_through_its_options(name, tmp_path):
    """What run.json records of a configuration (its fields, flat) gives back the option values that configure it
    again, through each option's own type and range check (``reproduce``'s path); only an export is not
    repeated."""
    args = parser_for_every_command().parse_args([name, *ASKED[name].split()])
    protocol = protocols()[name]
    config = protocol.configure(args, model_settings(args), tmp_path / "asked")
    record = json.loads(json.dumps({**recorded(config), **config.model.record()}, default=str))
    _, rebuilt = configured(tmp_path, {"protocol": name, "config": record}, tmp_path / "asked")
    if name in ("ruler", "needle"):
        assert (config.export, rebuilt.export) == ("x.parquet" if name == "ruler" else None, None)
        rebuilt.export = config.export
    assert rebuilt == config


@pytest.mark.parametrize("run", sorted((ROOT / "results").glob("*/*/run.json")), ids=lambda path: path.parent.name)
def test_every_committed_run_json_rebuilds_the_settings_it_records(run, tmp_path):
    record = json.loads(run.read_text())
    protocol, config = configured(run.parent, record, tmp_path)
    rebuilt = json.loads(json.dumps({**recorded(config), **config.model.record()}, default=str))
    plan_settings = ("budgets", "data_dir", "output", "threads", "allow_import")  # the plan's or the machine's
    assert {key: value for key, value in record["config"].items() if key in rebuilt and key not in plan_settings} == {
        key: value for key, value in rebuilt.items() if key in record["config"] and key not in plan_settings
    }
    assert protocol.name == record["protocol"]


def test_every_shipped_protocol_has_its_work_registered_and_the_score_command_finds_its_rescoring():
    known = protocols()
    assert list(known)[: len(SHIPPED)] == list(SHIPPED)
    assert all(known[name].implementation in IMPLEMENTED for name in SHIPPED)
    rescoring = [name for name in SHIPPED if known[name].rescoring is not None]
    assert rescoring == ["longbench", "locomo"]
