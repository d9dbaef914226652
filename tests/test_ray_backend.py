"""The Ray backend computes what the local backend computes: the same rows and scorecards, byte for byte, on a
local Ray instance with 2 workers; a worker killed mid-run loses and duplicates nothing; the local backend
never imports ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evaluation.cli.main import main
from evaluation.runs import backends
from tests.helpers import saved_chat_model, tiny_model
from tests.test_locomo_protocol import CONVERSATION
from tests.test_longbench_protocol import write_task

ray = pytest.importorskip("ray", reason="the Ray backend needs the optional extra: pip install -e '.[ray]'")
PROMPTS = {"hotpotqa": "Read the passages.\n\n{context}\n\nQuestion: {input}\nAnswer:"}


@pytest.fixture(scope="module")
def ray_instance():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return saved_chat_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", context=4096)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    (folder / "longbench" / "config").mkdir(parents=True)
    (folder / "longbench" / "config" / "dataset2prompt.json").write_text(json.dumps(PROMPTS))
    (folder / "longbench" / "config" / "dataset2maxlen.json").write_text(json.dumps({"hotpotqa": 5}))
    write_task(folder / "longbench", "hotpotqa", 4, seed=3)
    second = {**CONVERSATION, "sample_id": "conv-2"}
    (folder / "locomo10.json").write_text(json.dumps([CONVERSATION, second]))
    return folder


def longbench_argv(model_dir: Path, data: Path, output: Path) -> list[str]:
    return [
        *("longbench", "--model", str(model_dir), "--data", str(data / "longbench"), "--tasks", "hotpotqa"),
        *("--presses", "full", "h2o", "tova", "rmm", "snapkv", "--ratios", "0.5", "--n", "4", "--output", str(output)),
    ]


def locomo_argv(model_dir: Path, data: Path, output: Path) -> list[str]:
    return [
        *("locomo", "--model", str(model_dir), "--data", str(data / "locomo10.json"), "--budgets", "200"),
        *("--presses", "full", "h2o", "rmm", "--max-turns", "3", "--max-new-tokens", "4", "--output", str(output)),
    ]


def sorted_lines(output: Path) -> list[str]:
    return sorted((output / "predictions.jsonl").read_text().splitlines())


def same_rows(remote: Path, local: Path) -> None:
    """Every row field for field, the answer's likelihood to 1e-5: the bound from when a Ray worker ran on one thread
    (a float32 reduction over another number of threads rounds otherwise); a worker now sets the run's count."""
    likelihood = [json.loads(line).pop("answer_nll", None) for line in sorted_lines(local)]
    rows = {side: [json.loads(line) for line in sorted_lines(side)] for side in (remote, local)}
    assert [dict(r, answer_nll=None) for r in rows[remote]] == [dict(r, answer_nll=None) for r in rows[local]]
    remote_likelihood = [row.get("answer_nll") for row in rows[remote]]
    assert [v is None for v in remote_likelihood] == [v is None for v in likelihood]
    assert all(abs(a - b) <= 1e-5 for a, b in zip(remote_likelihood, likelihood, strict=True) if a is not None)


def same_scorecards(remote: Path, local: Path) -> None:
    """The official score's lines byte for byte; the answer likelihood's (its own metric) to 1e-4 (``same_rows``)."""
    import pandas as pd

    cards = {side: pd.read_csv(side / "scorecard.csv") for side in (remote, local)}
    official = {side: card[card["metric"] != "answer NLL"] for side, card in cards.items()}
    pd.testing.assert_frame_equal(official[remote], official[local])
    likelihood = {side: card[card["metric"] == "answer NLL"] for side, card in cards.items()}
    assert len(likelihood[local]), "the scorecard reports the answer likelihood"
    pd.testing.assert_series_equal(likelihood[remote]["mean"], likelihood[local]["mean"], atol=1e-4, rtol=0)
    text = {side: (side / "scorecard.md").read_text() for side in (remote, local)}
    assert text[remote].split("## answer NLL")[0] == text[local].split("## answer NLL")[0]


@pytest.mark.parametrize("protocol", [longbench_argv, locomo_argv], ids=["longbench", "locomo"])
def test_ray_with_two_workers_equals_the_local_backend_byte_for_byte(ray_instance, model_dir, data, tmp_path, protocol):
    local, remote = tmp_path / "local" / "run", tmp_path / "ray" / "run"  # the folder name titles the scorecard
    assert main(protocol(model_dir, data, local)) == 0
    assert main([*protocol(model_dir, data, remote), "--backend", "ray", "--workers", "2"]) == 0
    same_rows(remote, local)
    same_scorecards(remote, local)
    record = json.loads((remote / "run.json").read_text())["sessions"][0]
    assert record["backend"] == "ray" and record["units_run"] == (4 if protocol is longbench_argv else 2)
    assert len(record["unit_seconds"]) == record["units_run"] and all(s > 0 for s in record["unit_seconds"].values())


IMPORTED = ("--presses", "full", "h2o", "tests.helpers:OwnPrefillKnorm", "kvpress:KnormPress", "--allow-import")


def perplexity_argv(model_dir: Path, data: Path, output: Path) -> list[str]:
    text = data / "own.txt"
    text.write_text("a text of my own, long enough to stream through the tiny model. " * 4)
    return [
        *("perplexity", "--model", str(model_dir), "--texts", "--text-file", str(text), "--length", "48"),
        *("--budgets", "16", "--presses", "full", "tova", "kvpress:KnormPress", "--allow-import"),
        *("--output", str(output)),
    ]


def test_presses_imported_by_path_travel_resolved_to_the_ray_workers(ray_instance, model_dir, data, tmp_path):
    """A Ray worker resolves no press spec: a run's cells carry their presses, resolved once with --allow-import
    where the run starts. A LongBench run (an imported press on its own prefill and one on the shared prefill) and
    a perplexity run (an imported scorer streamed) give the local backend's rows."""
    local, remote = tmp_path / "local" / "run", tmp_path / "ray" / "run"
    argv = [*longbench_argv(model_dir, data, local), *IMPORTED]
    assert main(argv) == 0
    assert main([*longbench_argv(model_dir, data, remote), *IMPORTED, "--backend", "ray", "--workers", "2"]) == 0
    same_rows(remote, local)
    presses = {json.loads(line)["press"] for line in sorted_lines(remote) if not json.loads(line).get("error")}
    assert {"tests.helpers:OwnPrefillKnorm", "kvpress:KnormPress"} <= presses
    local, remote = tmp_path / "local" / "ppl", tmp_path / "ray" / "ppl"
    assert main(perplexity_argv(model_dir, data, local)) == 0
    assert main([*perplexity_argv(model_dir, data, remote), "--backend", "ray", "--workers", "2"]) == 0
    rows = {side: [json.loads(line) for line in sorted_lines(side)] for side in (remote, local)}
    assert len(rows[remote]) == 3 and not any(row.get("error") for row in rows[remote])
    for ours, theirs in zip(rows[remote], rows[local], strict=True):
        assert ours.pop("nll") == pytest.approx(theirs.pop("nll"), abs=1e-5)
        assert ours.pop("nll_by_position") == pytest.approx(theirs.pop("nll_by_position"), abs=1e-5)
        assert ours.pop("score") == pytest.approx(theirs.pop("score"), abs=1e-5)
        assert ours == theirs


def test_a_worker_killed_mid_run_loses_and_duplicates_nothing(ray_instance, model_dir, data, tmp_path, monkeypatch):
    """The worker running the second example dies once, mid-unit; a fresh worker reruns that unit."""
    from evaluation.protocols.longbench import cells as runner

    marker, real = tmp_path / "killed-once", runner.run_example

    def dies_once(loaded, unit, store, **kwargs):
        if unit.name.endswith("hotpotqa-1") and not marker.exists():
            marker.touch()
            os._exit(1)
        real(loaded, unit, store, **kwargs)

    local, remote = tmp_path / "local" / "run", tmp_path / "ray" / "run"  # the folder name titles the scorecard
    assert main(longbench_argv(model_dir, data, local)) == 0
    monkeypatch.setattr(runner, "run_example", dies_once)
    assert main([*longbench_argv(model_dir, data, remote), "--backend", "ray", "--workers", "2"]) == 0
    assert marker.exists(), "a worker was killed"
    rows = [json.loads(line) for line in sorted_lines(remote)]
    keys = [(r["id"], r["press"], r["budget"]) for r in rows]
    assert len(keys) == len(set(keys)) == 4 * (1 + 4), "every cell once"
    same_rows(remote, local)


def test_a_unit_that_always_fails_is_reported_and_the_rest_are_saved(
    ray_instance, model_dir, data, tmp_path, capsys, monkeypatch
):
    from evaluation.protocols.longbench import cells as runner

    real = runner.run_example

    def fails(loaded, unit, store, **kwargs):
        if unit.name.endswith("hotpotqa-2"):
            raise RuntimeError("this example cannot be computed")
        real(loaded, unit, store, **kwargs)

    monkeypatch.setattr(runner, "run_example", fails)
    output = tmp_path / "ray"
    argv = [*longbench_argv(model_dir, data, output), "--backend", "ray", "--workers", "2", "--retries", "1"]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "1 unit(s) failed after 2 tries" in error and "hotpotqa/hotpotqa-2" in error
    assert "this example cannot be computed" in error
    assert {json.loads(line)["id"] for line in sorted_lines(output)} == {"hotpotqa-0", "hotpotqa-1", "hotpotqa-3"}
    assert (output / "scorecard.md").exists(), "the finished units' scorecard is written"


def test_the_local_backend_never_imports_ray(model_dir, data, tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from evaluation.cli.main import main\n"
        f"sys.exit(main({longbench_argv(model_dir, data, tmp_path / 'local')!r}))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
    assert "ray" not in backends.__dict__


class FakeRay:
    """Ray's surface as the backend uses it, run in this process: what each worker asks Ray for is recorded."""

    class exceptions:
        RayActorError = type("RayActorError", (Exception,), {})
        RayTaskError = type("RayTaskError", (Exception,), {})

    def __init__(self, resources: dict) -> None:
        self.resources, self.options = resources, []

    def is_initialized(self) -> bool:
        return True

    def cluster_resources(self) -> dict:
        return self.resources

    def remote(self, **options):
        self.options.append(options)

        def actor_class(cls):
            def start(*args):
                worker = cls(*args)
                return type(
                    "Actor", (), {"run": type("Method", (), {"remote": lambda self, *a: lambda: worker.run(*a)})()}
                )()

            return type("ActorClass", (), {"remote": staticmethod(start)})

        return actor_class

    def wait(self, refs: list, num_returns: int) -> tuple[list, list]:
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        return ref()


@pytest.mark.parametrize(
    ("placement", "worker_device", "worker_map"),
    [
        (["--device", "cuda"], "cuda", None),
        (["--device", "cuda:1"], "cuda", None),
        (["--device-map", "auto"], "cpu", "auto"),
    ],
)
def test_on_a_cpu_only_driver_each_worker_asks_for_its_gpu_and_loads_onto_it(
    model_dir, data, tmp_path, monkeypatch, placement, worker_device, worker_map
):
    import torch

    from evaluation.runs.models import ModelSettings

    fake = FakeRay({"GPU": 2.0, "CPU": 8.0})
    monkeypatch.setitem(sys.modules, "ray", fake)
    loads = []
    real_load = ModelSettings.load

    def load(settings):
        loads.append((settings.device, settings.device_map))
        return real_load(ModelSettings(settings.name))  # the tiny model, on this CPU

    monkeypatch.setattr(ModelSettings, "load", load)
    threads = torch.get_num_threads()
    try:
        argv = [*longbench_argv(model_dir, data, tmp_path / "run"), "--backend", "ray", "--workers", "2", *placement]
        assert main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    assert fake.options == [{"num_gpus": 1, "num_cpus": 4}]
    assert loads == [(worker_device, worker_map)] * 2, "Ray shows each worker its own GPU as cuda:0"


def test_a_model_loads_straight_onto_its_device(model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    from evaluation.runs.models import load_model

    calls = []

    def from_pretrained(path, **kwargs):
        calls.append(kwargs.get("device_map"))
        return tiny_model("qwen2", "sdpa")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
    load_model(str(model_dir), device="cuda:1")
    load_model(str(model_dir), device="cpu")
    load_model(str(model_dir), device_map="auto")
    assert calls == [{"": "cuda:1"}, None, "auto"]
