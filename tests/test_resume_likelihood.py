"""A resumed run completes the rows older code stored without the answer's likelihood: the values equal a fresh
run's, nothing is generated again, and every other field of every row stays as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.cli.main import main
from evaluation.engine import decoding
from evaluation.protocols.probe.protocol import PROBE_LIKELIHOOD
from evaluation.protocols.protocol import LIKELIHOOD
from evaluation.runs.store import ResultStore
from tests.test_answer_likelihood import locomo_data, locomo_model_dir  # noqa: F401 (fixtures)
from tests.test_locomo_protocol import locomo as run_locomo
from tests.test_longbench_protocol import data_dir, model_dir  # noqa: F401 (fixtures)

TOLERANCE = 1e-5  # a smaller batch of caches rounds a float32 reduction otherwise


def read(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]


def strip(output: Path, fields: tuple[str, ...]) -> None:
    """The stored rows as older code wrote them: without ``fields``."""
    rows = [{k: v for k, v in row.items() if k not in fields} for row in read(output)]
    (output / "predictions.jsonl").write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


@pytest.fixture
def generations(monkeypatch) -> list[int]:
    """Counts every greedy step of any decoding (one per generated token of a batch)."""
    steps: list[int] = []
    step = decoding.greedy_step

    def counted(*args, **kwargs):
        steps.append(1)
        return step(*args, **kwargs)

    monkeypatch.setattr(decoding, "greedy_step", counted)
    return steps


def check_completed(fresh: list[dict], resumed: list[dict], fields: tuple[str, ...]) -> None:
    assert len(resumed) == len(fresh)
    for before, after in zip(fresh, resumed, strict=True):
        assert list(after) == list(before), "the same fields, in the same order"
        for field, value in before.items():
            if field in fields and isinstance(value, float):
                assert after[field] == pytest.approx(value, abs=TOLERANCE), (before["press"], field)
            else:
                assert after[field] == value, (before["press"], field)
    assert any(isinstance(row.get(fields[0]), float) for row in resumed)


def test_a_resumed_longbench_run_fills_the_likelihood_without_generating(
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    generations,
):
    output = tmp_path / "run"
    argv = ["longbench", "--model", str(model_dir), "--data", str(data_dir), "--tasks", "hotpotqa", "trec"]
    argv += ["--presses", "full", "snapkv", "knorm", "tests.helpers:OwnPrefillKnorm", "--allow-import"]
    argv += ["--ratios", "0.5", "--n", "2", "--max-length", "200", "--output", str(output)]
    assert main(argv) == 0
    fresh = read(output)
    assert generations, "a fresh run generates"
    strip(output, LIKELIHOOD)
    generations.clear()
    assert main(argv) == 0
    assert not generations, "no token generated on resume"
    check_completed(fresh, read(output), LIKELIHOOD)
    stored = (output / "predictions.jsonl").read_bytes()
    assert main(argv) == 0 and (output / "predictions.jsonl").read_bytes() == stored, "complete: nothing to do"


def test_a_resumed_streamed_run_fills_the_likelihood_without_generating(
    locomo_model_dir,  # noqa: F811
    locomo_data,  # noqa: F811
    tmp_path,
    generations,
):
    output = tmp_path / "run"
    extra = ("--presses", "full", "knorm", "tests.helpers:OwnPrefillKnorm", "--allow-import")
    assert run_locomo(locomo_model_dir, locomo_data, output, *extra) == 0
    fresh = read(output)
    assert generations, "a fresh run generates"
    strip(output, LIKELIHOOD)
    generations.clear()
    assert run_locomo(locomo_model_dir, locomo_data, output, *extra) == 0
    assert not generations, "no token generated on resume"
    check_completed(fresh, read(output), LIKELIHOOD)


def test_amend_only_adds_fields_and_survives_a_reopen(tmp_path):
    path = tmp_path / "predictions.jsonl"
    store = ResultStore(path, lambda row: row["id"])
    store.append({"id": 1, "score": 0.5})
    store.append({"id": 2, "score": 1.0})
    store.amend([{"id": 2, "score": 1.0, "answer_nll": 0.25}])
    assert ResultStore(path, lambda row: row["id"]).rows == [
        {"id": 1, "score": 0.5},
        {"id": 2, "score": 1.0, "answer_nll": 0.25},
    ]
    with pytest.raises(ValueError, match="keep every field"):
        store.amend([{"id": 1, "score": 0.0, "answer_nll": 0.25}])
    with pytest.raises(ValueError, match="keep every field"):
        store.amend([{"id": 3, "score": 0.0}])
    assert path.read_text().count("\n") == 2


def test_a_resumed_probe_run_fills_the_likelihood_without_answering_again(model_dir, tmp_path, generations):  # noqa: F811
    output = tmp_path / "run"
    argv = ["probe", "--model", str(model_dir), "--probes", "2", "--max-new-tokens", "6", "--output", str(output)]
    assert main(argv) == 0
    fresh = read(output)
    assert generations, "a fresh run answers each probe"
    strip(output, PROBE_LIKELIHOOD)
    generations.clear()
    assert main(argv) == 0
    assert not generations, "no probe answered again on resume"
    check_completed(fresh, read(output), PROBE_LIKELIHOOD)


def test_a_ray_worker_store_returns_its_amended_rows_for_the_driver(tmp_path):
    from evaluation.runs.store import MemoryStore

    driver = ResultStore(tmp_path / "predictions.jsonl", lambda row: row["id"])
    driver.append({"id": 1, "score": 0.5})
    worker = MemoryStore(driver.key, [dict(row) for row in driver.rows])
    worker.amend([{"id": 1, "score": 0.5, "answer_nll": 0.25, "answer_tokens": 2}])
    assert worker.new_rows == [] and worker.amended_rows == [worker.get(1)]
    driver.amend(worker.amended_rows)
    assert json.loads((tmp_path / "predictions.jsonl").read_text()) == worker.get(1)
