"""A press spec's value outside its parameter's range is refused when the spec is resolved, in one ``error:`` line
naming the parameter, its value and the range, before a model loads and before a run folder exists, in a dry run
too; a value at the edge of its range still runs. The ranges KVPress leaves unchecked are declared
(``evaluation.catalogue.ranges``) and held to what KVPress's code does with a value outside them."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from kvpress import PyramidKVPress, SnapKVPress, StreamingLLMPress

from evaluation.catalogue.ranges import RANGES, ranges
from evaluation.cli.main import main
from tests.helpers import prefill, tiny_model
from tests.test_bad_input import one_line_error
from tests.test_bad_input_round4 import longbench_argv, longbench_data


@pytest.fixture
def data(tmp_path) -> Path:
    return longbench_data(tmp_path / "longbench")


WINDOW = "SnapKVPress's window_size (the newest queries that score the keys) must be >= 1"
KERNEL = "SnapKVPress's kernel_size (the width of the scores' pooling) must be odd and >= 1"
OUT_OF_RANGE = [  # a spec, then what its one line says (the parameter, its range, its value)
    ("snapkv(window_size=-1)", f"{WINDOW}, not -1"),
    ("snapkv(window_size=0)", f"{WINDOW}, not 0"),
    ("snapkv(kernel_size=4)", f"{KERNEL}, not 4"),
    ("adakv(snapkv(window_size=0))", f"{WINDOW}, not 0"),
    ("pyramidkv(beta=0)", "PyramidKVPress's beta (the steepness of the pyramid of layer budgets) must be >= 1, not 0"),
    ("streaming_llm(n_sink=-1)", "StreamingLLMPress's n_sink (the first positions never evicted) must be >= 0, not -1"),
    ("random(seed=-1)", "RandomPress's seed (the draws of the random scores) must be in [0, 2**64), not -1"),
    ("lagkv(lag_size=0)", "LagKVPress's lag_size (positions per partition) must be >= 1, not 0"),
    ("merging(knorm,similarity_threshold=2)", "MergingPress's similarity_threshold (the least similarity at which"),
    ("rmm(lag=-1)", "RMMPress: lag must be None or an integer >= 0 (the commit lag H), got -1"),
    ("rmm(chunk_size=0)", "RMMPress: chunk_size must be a positive integer, got 0"),
    ("rmm(correctness='random',seed=-1)", "RMMPress: seed must be a whole number in [0, 4294967296), got -1"),
    ("recent_window(window=-1)", "RecentWindowPress: window must be an integer >= 0 (newest positions never evicted)"),
    ("tova(compression_ratio=1.5)", "TOVAPress: compression_ratio must be in [0, 1) (the fraction of the cache to"),
    ("snapkv(compression_ratio=1.5)", "SnapKVPress: Compression ratio must be between 0 and 1"),
    ("decoding(knorm,compression_interval=0)", "DecodingPress: compression_interval must be greater than 0"),
]


@pytest.mark.parametrize("dry_run", [["--dry-run"], []])
@pytest.mark.parametrize(("spec", "message"), OUT_OF_RANGE)
def test_a_value_out_of_range_is_one_line_before_any_work(data, tmp_path, capsys, spec, message, dry_run):
    """The model is absent: a real run that reached it would fail on another line."""
    assert main([*longbench_argv(data, tmp_path / "run", "--presses", "full", spec), *dry_run]) == 2
    assert one_line_error(capsys).startswith(f"error: press spec {spec!r}: {message}")
    assert not (tmp_path / "run").exists()


def test_a_dry_run_that_names_an_import_path_still_builds_the_presses_it_knows(data, tmp_path, capsys):
    """A dry run imports no import path, so the press that holds one is not built; the presses beside it are."""
    spec = "composed([rmm(lag=-1),kvpress:KnormPress])"
    argv = [*longbench_argv(data, tmp_path / "run", "--presses", spec), "--allow-import", "--dry-run"]
    assert main(argv) == 2
    assert "RMMPress: lag must be None or an integer >= 0" in one_line_error(capsys)
    good = [*longbench_argv(data, tmp_path / "run", "--presses", "composed([rmm(lag=2),kvpress:KnormPress])")]
    assert main([*good, "--allow-import", "--dry-run"]) == 0


AT_THE_EDGE = [
    "snapkv(window_size=1,kernel_size=1)",
    "pyramidkv(beta=1)",
    "streaming_llm(n_sink=0)",
    "random(seed=0)",
    "random(seed=18446744073709551615)",
    "lagkv(lag_size=1)",
    "merging(knorm,similarity_threshold=1.0)",
    "rmm(lag=0)",
    "recent_window(window=0)",
    "rmm(correctness='random',seed=4294967295)",
]


def test_values_at_the_edge_of_their_range_still_resolve(data, tmp_path, capsys):
    assert main([*longbench_argv(data, tmp_path / "run", "--presses", "full", *AT_THE_EDGE), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all(f"{spec} @" in out for spec in AT_THE_EDGE), out


def test_every_declared_range_names_a_parameter_of_its_class_and_holds_kvpress_default():
    for cls, declared in RANGES.items():
        parameters = inspect.signature(cls).parameters
        assert set(declared) <= set(parameters), (cls.__name__, set(declared) - set(parameters))
        for name, allowed in declared.items():
            default = parameters[name].default
            assert default is None or allowed.admits(default), (cls.__name__, name, default)


def test_a_subclass_inherits_its_bases_ranges():
    pyramid = ranges(PyramidKVPress)
    assert pyramid["window_size"] is RANGES[SnapKVPress]["window_size"] and "beta" in pyramid


# What KVPress does with a value outside a declared range: the independent truth the table stands on.


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", "eager")


def test_an_even_kernel_size_fails_mid_run_where_an_odd_one_runs(model):
    input_ids = torch.randint(3, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    prefill(model, input_ids, SnapKVPress(compression_ratio=0.5, window_size=8, kernel_size=3))
    with pytest.raises(RuntimeError):
        prefill(model, input_ids, SnapKVPress(compression_ratio=0.5, window_size=8, kernel_size=4))


def test_a_negative_sink_count_marks_no_position_for_eviction():
    """StreamingLLM zeroes the scores of the positions after its sinks; at n_sink=-1 that slice is empty, so every
    score ties and ``topk``'s tie order, not the press, decides what is evicted."""
    keys = torch.zeros(1, 2, 40, 8)
    at_zero = StreamingLLMPress(compression_ratio=0.5, n_sink=0).score(None, None, keys, None, None, {})
    assert (at_zero == 0).sum(-1).tolist() == [[20, 20]]
    negative = StreamingLLMPress(compression_ratio=0.5, n_sink=-1).score(None, None, keys, None, None, {})
    assert (negative == 1).all()
