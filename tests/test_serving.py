"""The engine's cell server (``evaluation.engine.serving``) is the one place a cell is served: a per-cell measure
added there, to a cell's ``measures``, reaches the rows of a single-turn protocol (LongBench) and of a streamed one
(LoCoMo), with no protocol changed."""

from __future__ import annotations

import json
from pathlib import Path

import evaluation.engine.serving as serving
from tests.test_locomo_protocol import data_file, locomo  # noqa: F401
from tests.test_locomo_protocol import model_dir as chat_model_dir  # noqa: F401
from tests.test_longbench_protocol import data_dir, longbench, model_dir  # noqa: F401


def rows_of(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]


def test_a_measure_added_in_the_server_reaches_every_protocols_rows(
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    chat_model_dir,  # noqa: F811
    data_file,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    measured = serving.measure

    def with_the_kept_share(server, history, derived, spans) -> None:
        measured(server, history, derived, spans)
        for cell in derived:
            cell.measures["kept_share"] = cell.cache.kept_tokens / history.length

    monkeypatch.setattr(serving, "measure", with_the_kept_share)
    presses = ("--presses", "full", "h2o", "tova", "decoding_knorm")  # the last on its own prefill
    assert longbench(model_dir, data_dir, tmp_path / "lb-run", *presses) == 0
    assert locomo(chat_model_dir, data_file, tmp_path / "locomo-run", *presses) == 0
    for output in ("lb-run", "locomo-run"):
        rows = [row for row in rows_of(tmp_path / output) if not row.get("error")]
        shared = [row for row in rows if row["path"] == "shared"]
        assert shared and all(0 < row["kept_share"] <= 1 for row in shared), output
        assert {row["kept_share"] for row in shared if row["press"] == "full"} == {1.0}, output
        own = [row for row in rows if row["path"] != "shared"]
        assert own and all("kept_share" not in row for row in own), output
