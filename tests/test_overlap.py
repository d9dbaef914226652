"""The kept-set overlap diagnostic: each cell's Jaccard index with the reference press's kept positions, per layer
and KV head, equals a hand computation from the positions KVPress's own prefills keep; a press against itself is 1;
the rows of both protocols carry it and their scorecards summarise it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from evaluation.catalogue.budgets import Budget, budget_key, ratio_for
from evaluation.catalogue.resolved import make_press
from evaluation.cli.main import main
from evaluation.engine.history import History
from evaluation.engine.overlap import overlaps
from evaluation.engine.retention import held_positions
from evaluation.protocols.longbench.data import load_configs, load_task
from evaluation.protocols.longbench.prompts import build_prompt
from evaluation.protocols.protocol import REFERENCE
from evaluation.reporting.conditions import Benchmark
from evaluation.reporting.intervals import bootstrap
from evaluation.reporting.overlap import PICTURE
from tests.helpers import prefill, tiny_model
from tests.test_answer_likelihood import locomo_data, locomo_model_dir  # noqa: F401 (fixtures)
from tests.test_locomo_protocol import locomo as run_locomo
from tests.test_longbench_protocol import data_dir, model_dir  # noqa: F401 (fixtures)
from tests.test_shared_prefill import per_cell_cache

PRESSES = ["h2o", "snapkv", "streaming_llm", "knorm"]
OWN_PREFILL = "tests.helpers:OwnPrefillKnorm"
ROUNDING = 1e-4  # a row stores each index to 4 digits


def own_prefill_positions(model, context: torch.Tensor, press: str, budget: Budget) -> list[list[set[int]]]:
    """Per layer and KV head, the positions KVPress's own prefill under the press keeps: each kept key matched to
    the nearest key of a plain full-cache prefill (eager where the press reads the weights, as the per-cell path)."""
    model.set_attn_implementation("sdpa")
    full = prefill(model, context)
    kept = per_cell_cache(model, context, press, budget)
    model.set_attn_implementation("sdpa")
    sets = []
    for full_layer, kept_layer in zip(full.layers, kept.layers, strict=True):
        nearest = torch.cdist(kept_layer.keys.float(), full_layer.keys.float(), p=float("inf")).argmin(-1)[0]
        sets.append([set(head.tolist()) for head in nearest])
    return sets


def hand_jaccard(mine: list[list[set[int]]], theirs: list[list[set[int]]]) -> tuple[list[float], list[float]]:
    """Per layer, the mean and the least over KV heads of |A & B| / |A | B|."""
    means, least = [], []
    for layer_a, layer_b in zip(mine, theirs, strict=True):
        indices = [len(a & b) / len(a | b) for a, b in zip(layer_a, layer_b, strict=True)]
        means.append(sum(indices) / len(indices))
        least.append(min(indices))
    return means, least


def test_the_jaccard_index_equals_a_hand_computation_from_kvpress_own_prefills(arch):
    model = tiny_model(arch, "sdpa")
    context = torch.randint(3, 256, (1, 90), generator=torch.Generator().manual_seed(5))
    budget = Budget("ratio", 0.5)
    built = [make_press(name, ratio_for(budget, 90)) for name in PRESSES]
    history = History(model, frozenset(), built)
    history.extend(context[0].tolist(), "context")
    held = [held_positions(history.cache, history.compress(press)) for press in built]
    found = overlaps([(name, budget_key(budget)) for name in PRESSES], held, REFERENCE)
    by_hand = {name: own_prefill_positions(model, context, name, budget) for name in PRESSES}
    for name, overlap in zip(PRESSES, found, strict=True):
        means, least = hand_jaccard(by_hand[name], by_hand[REFERENCE])
        assert overlap["overlap_with_reference"] == pytest.approx(means, abs=ROUNDING), name
        assert overlap["overlap_min_head"] == pytest.approx(least, abs=ROUNDING), name
    assert found[0] == {"overlap_with_reference": [1.0] * len(held[0]), "overlap_min_head": [1.0] * len(held[0])}
    assert min(min(overlap["overlap_min_head"]) for overlap in found) < 1, "the presses keep different positions"
    other = overlaps([("knorm", "b"), (REFERENCE, "a")], held[2:4], REFERENCE)
    assert other[0]["overlap_with_reference"] is None, "no reference at the cell's budget: unknown"


def test_a_cell_without_known_positions_has_no_overlap():
    ones = [torch.ones(1, 2, 4, dtype=torch.bool)]
    found = overlaps([(REFERENCE, "b"), ("x", "b"), ("y", "b")], [ones, None, ones], REFERENCE)
    assert found[1] == {"overlap_with_reference": None, "overlap_min_head": None}
    assert found[2]["overlap_with_reference"] == [1.0]


def test_longbench_rows_carry_the_overlap_and_the_scorecard_summarises_it(model_dir, data_dir, tmp_path):  # noqa: F811
    output = tmp_path / "run"
    argv = ["longbench", "--model", str(model_dir), "--data", str(data_dir), "--tasks", "hotpotqa", "--n", "2"]
    argv += ["--presses", "full", *PRESSES, OWN_PREFILL, "--allow-import", "--ratios", "0.5", "--max-length", "200"]
    assert main([*argv, "--output", str(output)]) == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = load_configs(data_dir, ["hotpotqa"])["hotpotqa"]
    examples = {example.id: example for example in load_task(data_dir, "hotpotqa", 2)}
    budget = Budget("ratio", 0.5)
    for example_id, example in examples.items():
        context = build_prompt(example, config, tokenizer, 200, False).context_ids
        by_hand = {name: own_prefill_positions(model, context, name, budget) for name in PRESSES}
        for row in (row for row in rows if row["id"] == example_id):
            if row["press"] in PRESSES:
                means, least = hand_jaccard(by_hand[row["press"]], by_hand[REFERENCE])
                assert row["overlap_with_reference"] == pytest.approx(means, abs=ROUNDING), row["press"]
                assert row["overlap_min_head"] == pytest.approx(least, abs=ROUNDING), row["press"]
            else:  # the full cache has no reference at its budget; a press on its own prefill keeps no known set
                assert row["overlap_with_reference"] is None and row["overlap_min_head"] is None, row["press"]
    card = (output / "scorecard.md").read_text()
    assert f"## Kept-set overlap with {REFERENCE}" in card and (output / PICTURE).exists()
    lines = [line for line in card.splitlines() if line.startswith("| streaming_llm | keep 50% |")]
    assert len(lines) == 1 and "| 2 |" in lines[0]


def test_streamed_rows_carry_the_overlap(locomo_model_dir, locomo_data, tmp_path):  # noqa: F811
    output = tmp_path / "run"
    assert run_locomo(locomo_model_dir, locomo_data, output) == 0  # full, h2o, rmm, tova, snapkv at 200 tokens
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    answered = [row for row in rows if not row.get("error")]
    for row in answered:
        overlap = row["overlap_with_reference"]
        if row["press"] == REFERENCE:
            assert set(overlap) == {1.0}
        elif row["press"] != "full":
            assert all(0 <= low <= mean <= 1 for low, mean in zip(row["overlap_min_head"], overlap, strict=True))
    assert any(min(row["overlap_min_head"] or [1]) < 1 for row in answered), "the presses keep different positions"
    assert f"## Kept-set overlap with {REFERENCE}" in (output / "scorecard.md").read_text()
    assert (output / PICTURE).exists()


def test_no_section_without_overlaps(tmp_path: Path):
    from evaluation.reporting.overlap import overlap_section

    rows = [{"press": "knorm", "budget_label": "50%", "overlap_with_reference": None, "overlap_min_head": None}]
    assert overlap_section(tmp_path, rows, REFERENCE, SHARED) == [] and not (tmp_path / PICTURE).exists()


SHARED = Benchmark(
    "Shared",
    lambda row: ["all"],
    lambda row: (row["id"],),
    1,
    3,
    cluster=lambda row: row["conversation"],
    cluster_unit="conversation",
)


def shared_rows(conversations: int, per: int) -> list[dict]:
    """Overlap rows of ``per`` inputs from each of ``conversations``, every input of a conversation with the same
    Jaccard index (all its variance between conversations: an intra-cluster correlation of 1)."""
    shares = np.random.default_rng(9).uniform(0.2, 0.8, conversations)
    return [
        {
            "id": f"c{c}-{i}",
            "conversation": f"c{c}",
            "press": "tova",
            "budget_label": "256",
            "overlap_with_reference": [float(shares[c])] * 2,
            "overlap_min_head": [float(shares[c]) / 2] * 2,
        }
        for c in range(conversations)
        for i in range(per)
    ]


def test_the_overlap_interval_is_a_bootstrap_of_the_protocol_s_clusters(tmp_path: Path):
    """With every input of a conversation alike, the 100 inputs hold the information of 10 values: the section's
    interval is the ordinary bootstrap of the 10 conversation values, draw for draw, and wider than a bootstrap
    of the 100 inputs as if independent; n gives inputs and conversations."""
    from evaluation.reporting.overlap import overlap_section

    rows = shared_rows(10, 10)
    lines = overlap_section(tmp_path, rows, REFERENCE, SHARED)
    values = np.array([row["overlap_with_reference"][0] for row in rows[::10]])
    expected = bootstrap(values)
    naive = bootstrap(np.repeat(values, 10))
    assert naive.high - naive.low < 0.5 * (expected.high - expected.low)
    row = next(line for line in lines if line.startswith("| tova | 256 |"))
    text = f"{expected.mean:.3f} [{expected.low:.3f}, {expected.high:.3f}]"
    assert row == f"| tova | 256 | {text} | 100 (10 conversations) | {values.mean() / 2:.3f} |"
    assert any("bootstrap interval over the conversations the inputs share" in line for line in lines)
    alone = overlap_section(tmp_path, rows, REFERENCE, replace(SHARED, cluster=None, cluster_unit="example"))
    row = next(line for line in alone if line.startswith("| tova | 256 |"))
    assert (
        row == f"| tova | 256 | {naive.mean:.3f} [{naive.low:.3f}, {naive.high:.3f}] | 100 | {values.mean() / 2:.3f} |"
    )
