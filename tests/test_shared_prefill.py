"""The shared path (one full-cache prefill per example, batched decoding) against the per-cell reference path."""

from __future__ import annotations

import json

import pytest
import torch

from evaluation.catalogue.budgets import Budget, ratio_for
from evaluation.catalogue.resolved import make_press
from evaluation.catalogue.specs import DEFAULT_PRESSES
from evaluation.engine.decoding import decode_batch, generate
from evaluation.engine.history import History
from tests.helpers import history_kept, implementation, prefill, tiny_model
from tests.test_longbench_protocol import data_dir, longbench, model_dir, read_rows  # noqa: F401

OWN_PREFILL = "tests.helpers:OwnPrefillKnorm"
CELLS = [("full", None)] + [
    (name, Budget(kind, value))
    for name in [*DEFAULT_PRESSES[1:], "rmm(lag=8)", "rmm(lag=8,correctness='random')"]
    for kind, value in [("ratio", 0.5), ("tokens", 30)]
]


def per_cell_cache(model, context: torch.Tensor, press_name: str, budget: Budget | None):
    """KVPress's prefill under the press, with the attention implementation the per-cell path uses."""
    model.set_attn_implementation(implementation(press_name))
    return prefill(model, context, make_press(press_name, ratio_for(budget, context.shape[1])))


@pytest.mark.parametrize(("press_name", "budget"), CELLS, ids=[f"{p}-{b.key if b else 'full'}" for p, b in CELLS])
def test_shared_and_per_cell_paths_keep_the_same_positions_and_predict_the_same(arch, press_name, budget):
    model = tiny_model(arch, "sdpa")
    generator = torch.Generator().manual_seed(5)
    context = torch.randint(3, 256, (1, 90), generator=generator)
    question = torch.randint(3, 256, (1, 5), generator=generator)
    ratio = ratio_for(budget, 90)
    press = make_press(press_name, ratio)
    history = History(model, frozenset({"context"}), [press])
    history.extend(context[0].tolist(), "context")
    cache, kept = history.compress(press), history_kept(history, press)
    full = prefill(model, context)
    reference = per_cell_cache(model, context, press_name, budget)
    for layer, indices in enumerate(kept):
        expected = torch.cdist(reference.layers[layer].keys, full.layers[layer].keys, p=float("inf")).argmin(-1)
        assert torch.equal(indices.sort(-1).values, expected.sort(-1).values), f"layer {layer}"
    shared = decode_batch(model, [cache], question, 90, 10, set())[0]
    per_cell = generate(model, context, question, make_press(press_name, ratio), 10, set()).token_ids
    model.set_attn_implementation("sdpa")
    assert shared == per_cell


def test_the_grid_on_both_paths_agrees_and_records_the_path_each_press_took(
    model_dir,  # noqa: F811
    data_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """KNorm runs its own hook on the shared prefill; a press that replaces KVPress's context manager (it may run
    forward passes of its own) falls back to the per-cell path on its own."""
    shared_run, per_cell_run = tmp_path / "shared", tmp_path / "per-cell"
    presses = ("--presses", "full", "snapkv", "h2o", "tova", "rmm", "knorm", OWN_PREFILL, "--allow-import")
    assert longbench(model_dir, data_dir, shared_run, *presses) == 0
    assert longbench(model_dir, data_dir, per_cell_run, *presses, "--path", "per-cell") == 0
    shared, per_cell = read_rows(shared_run), read_rows(per_cell_run)
    assert len(shared) == len(per_cell) == 2 * 2 * (1 + 6 * 2)
    for row in shared:
        assert row["path"] == ("per-cell" if row["press"] == OWN_PREFILL else "shared")
        assert row["attn_implementation"] == (
            "eager" if row["press"] == "h2o" and row["path"] == "per-cell" else "sdpa"
        )
    assert {row["path"] for row in per_cell} == {"per-cell"}
    key = ("task", "id", "press", "budget")
    by_key = {tuple(row[k] for k in key): row for row in per_cell}
    for row in shared:
        other = by_key[tuple(row[k] for k in key)]
        assert (row["prediction"], row["kept_tokens"]) == (other["prediction"], other["kept_tokens"]), json.dumps(row)
