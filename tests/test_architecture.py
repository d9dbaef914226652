"""docs/architecture.md's protocol example runs as written: registered, it is a subcommand with a dry run and a
run that resumes and writes its scorecard; nothing else in the harness changes for it."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from evaluation.cli.main import main
from evaluation.protocols import protocol as registry
from tests.test_longbench_protocol import model_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


def example_module(tmp_path: Path, monkeypatch):
    text = (ROOT / "docs" / "architecture.md").read_text()
    code = re.search(r"## Adding a protocol.*?```python\n(.*?)```", text, re.S).group(1)
    path = tmp_path / "my_protocol.py"
    path.write_text(code)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry.protocols()))
    spec = importlib.util.spec_from_file_location("my_protocol", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(__import__("sys").modules, "my_protocol", module)
    spec.loader.exec_module(module)
    return module


def test_the_documented_protocol_is_one_module_and_its_registration(model_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    example_module(tmp_path, monkeypatch)
    assert "echo" in registry.protocols()
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
    assert record["protocol"] == "echo" and record["pooled_settings"] == ["dtype", "attn_implementation", "presses"]
    assert main(["echo", "--model", str(model_dir), "--output", str(output)]) == 0, "a finished run resumes"
    assert len((output / "predictions.jsonl").read_text().splitlines()) == 2
