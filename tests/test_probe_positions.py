"""The probe's controls for position: gold facts at fixed middle positions or at recency ranks 5 to 8, and the rows
re-read by the gold facts' recency rank."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from evaluation.cli.main import main
from evaluation.protocols.probe.facts import FACTS, LIVES, MIDDLE, RECENCY_5_8, probes, solve
from evaluation.protocols.probe.positions import bin_label, older_gold_ranks, position_benchmark, position_summary
from evaluation.protocols.probe.protocol import CORRECT, INCORRECT, PROBES, RECENCY, ProbeConfig, top_label
from evaluation.protocols.probe.work import probe_rows
from evaluation.protocols.protocol import results_defining
from evaluation.runs.models import ModelSettings
from evaluation.runs.record import RunRecord
from tests.helpers import byte_tokenizer, tiny_model

COMMITTED = Path(__file__).parents[1] / "results" / "probe" / "smollm2-135m"
COMMITTED_MIDDLE = COMMITTED.with_name("smollm2-135m-middle")
# sha256 of probes(0, 400) as ``generation`` writes it, computed with the generator at main a214d6a (identical,
# but for an import path, to 0e62bc8's, which made the committed run)
DEFAULT_DIGEST = "c0c3d01973a2de97009f7a8f52e67314488d5243d1f4737bf02e6f0cec8b3778"


def generation(placement: str = "shuffled") -> str:
    made = probes(0, 400, placement)
    return json.dumps([[p.index, list(p.facts), p.question, p.answer, p.bridge, list(p.gold)] for p in made])


def test_the_default_generation_is_unchanged_byte_for_byte():
    assert hashlib.sha256(generation().encode()).hexdigest() == DEFAULT_DIGEST
    assert len({generation(), generation("middle"), generation("recency-5-8")}) == 3


@pytest.mark.parametrize(("folder", "placement"), [(COMMITTED, "shuffled"), (COMMITTED_MIDDLE, "middle")])
def test_the_committed_rows_hold_their_generations_gold_facts_and_answers(folder, placement):
    if not (folder / "predictions.jsonl").exists():
        pytest.skip("no committed probe run")
    made = {probe.index: probe for probe in probes(0, 400, placement)}
    with open(folder / "predictions.jsonl") as lines:
        recency = [row for line in lines if (row := json.loads(line))["press"] == RECENCY]
    assert len({row["probe"] for row in recency}) == 400
    for row in recency:  # recency rank r is position FACTS - r
        probe = made[row["probe"]]
        assert tuple(FACTS - rank for rank in row["gold_ranks"]) == probe.gold and row["answer"] == probe.answer


def test_middle_placement_puts_the_gold_facts_at_7_and_9_in_their_order_and_keeps_everything_else():
    assert MIDDLE == (6, 8)
    orders = set()
    for shuffled, middle in zip(probes(3, 200), probes(3, 200, "middle"), strict=True):
        home_first = shuffled.gold[0] < shuffled.gold[1]
        orders.add(home_first)
        assert middle.gold == (MIDDLE if home_first else MIDDLE[::-1])
        assert (middle.question, middle.answer, middle.bridge) == (shuffled.question, shuffled.answer, shuffled.bridge)
        assert solve(middle.facts, middle.question) == (middle.answer, middle.gold)
        home, flag = middle.facts[middle.gold[0]], middle.facts[middle.gold[1]]
        assert LIVES.match(home) and home.endswith(f" {middle.bridge}.") and flag.endswith(f" {middle.answer}.")
        assert (home, flag) == (shuffled.facts[shuffled.gold[0]], shuffled.facts[shuffled.gold[1]])
        distractors = [f for i, f in enumerate(shuffled.facts) if i not in shuffled.gold]
        assert [f for i, f in enumerate(middle.facts) if i not in MIDDLE] == distractors
    assert orders == {True, False}  # both gold orders occur, as in the shuffled probes
    with pytest.raises(ValueError, match="no gold-fact placement"):
        probes(0, 1, "edge")


def test_recency_5_8_puts_both_gold_facts_at_recency_ranks_5_to_8_and_keeps_everything_else():
    """Both gold facts among the 9th to 12th of 16 (recency ranks 8 to 5), in their shuffled order, every pair of
    those positions drawn; the facts, question, gold facts and distractor order are the shuffled probe's."""
    assert [FACTS - position for position in RECENCY_5_8] == [8, 7, 6, 5]
    pairs, orders = set(), set()
    for shuffled, placed in zip(probes(3, 200), probes(3, 200, "recency-5-8"), strict=True):
        assert all(5 <= FACTS - position <= 8 for position in placed.gold)
        home_first = shuffled.gold[0] < shuffled.gold[1]
        assert (placed.gold[0] < placed.gold[1]) == home_first
        orders.add(home_first)
        pairs.add(tuple(sorted(placed.gold)))
        assert (placed.question, placed.answer, placed.bridge) == (shuffled.question, shuffled.answer, shuffled.bridge)
        assert solve(placed.facts, placed.question) == (placed.answer, placed.gold)
        assert [placed.facts[g] for g in placed.gold] == [shuffled.facts[g] for g in shuffled.gold]
        distractors = [f for i, f in enumerate(shuffled.facts) if i not in shuffled.gold]
        assert [f for i, f in enumerate(placed.facts) if i not in placed.gold] == distractors
    assert orders == {True, False}
    assert pairs == {(a, b) for a in RECENCY_5_8 for b in RECENCY_5_8 if a < b}, "every pair of positions occurs"
    assert probes(3, 200, "recency-5-8") == probes(3, 200, "recency-5-8"), "deterministic in the seed"


def test_on_a_tiny_model_recency_ranks_the_recency_5_8_gold_facts_5th_to_8th_and_finds_neither():
    model, tokenizer = tiny_model("llama", "sdpa", vocab_size=260), byte_tokenizer()
    config = ProbeConfig(
        model=ModelSettings(),
        seed=7,
        probes=2,
        reasoning=True,
        output=Path("unused"),
        max_new_tokens=4,
        gold_positions="recency-5-8",
    )
    for probe in probes(7, 2, "recency-5-8"):
        rows = probe_rows((model, tokenizer), probe, config)
        recency = [row for row in rows if row["press"] == RECENCY]
        assert [row["budget"] for row in recency] == [top_label(2), top_label(4)]
        for row in recency:
            assert all(5 <= rank <= 8 for rank in row["gold_ranks"]) and row["score"] == 0.0
            assert sorted(FACTS - rank for rank in row["gold_ranks"]) == sorted(probe.gold)


def test_the_placement_defines_the_run_and_an_older_run_stands_for_shuffled(tmp_path, capsys):
    assert main(["probe", "--probes", "2", "--gold-positions", "middle", "--dry-run", "--output", str(tmp_path)]) == 0
    assert "the gold facts at positions 7 and 9 of 16" in capsys.readouterr().out
    argv = ["probe", "--probes", "2", "--gold-positions", "recency-5-8", "--dry-run", "--output", str(tmp_path)]
    assert main(argv) == 0
    assert "the gold facts at two of the positions 9 to 12 of 16 (recency ranks 5 to 8)" in capsys.readouterr().out
    assert main(["probe", "--gold-positions", "edge", "--dry-run", "--output", str(tmp_path)]) == 2
    assert "invalid choice: 'edge'" in capsys.readouterr().err
    config = ProbeConfig(model=ModelSettings(), seed=0, probes=400, reasoning=True, output=tmp_path)
    defining = tuple(results_defining(config))
    assert "gold_positions" in defining
    older = {"seed": 0, "reasoning": True, "max_new_tokens": 40, **ModelSettings().record()}  # no gold_positions
    (tmp_path / "run.json").write_text(json.dumps({"config": older, "sessions": []}))
    with RunRecord(tmp_path, {**older, "gold_positions": "shuffled"}, defining, PROBES.record_defaults()):
        pass
    with pytest.raises(Exception, match="gold_positions: stored 'shuffled', asked 'middle'"):
        RunRecord(tmp_path, {**older, "gold_positions": "middle"}, defining, PROBES.record_defaults())


def row(probe: int, press: str, k: int, ranks: list[int], correct: bool) -> dict:
    label = top_label(k)
    score = float(max(ranks) <= k)
    fields = {"press": press, "budget": label, "budget_label": label, "score": score, "gold_ranks": ranks}
    return {"probe": probe, "correct": correct, "prediction": f"{probe} {press}", **fields}


def test_the_rows_re_read_by_position_match_a_hand_count():
    # probe: (its gold facts' recency ranks, answered correctly, demonstrated utility's ranks)
    probes_by_hand = {
        0: ([1, 3], True, [1, 2]),  # older gold fact at rank 3: bin 2-4
        1: ([2, 4], False, [1, 5]),  # rank 4: bin 2-4
        2: ([6, 1], True, [2, 3]),  # rank 6: bin 5-8
        3: ([9, 7], False, [4, 6]),  # rank 9: bin 9-12
        4: ([5, 8], True, [9, 1]),  # rank 8: bin 5-8
    }
    rows = [
        row(probe, press, k, recency if press == RECENCY else utility, correct)
        for probe, (recency, correct, utility) in probes_by_hand.items()
        for press in (RECENCY, "demonstrated utility", "h2o")
        for k in (2, 4)
    ]
    assert older_gold_ranks(rows) == {0: 3, 1: 4, 2: 6, 3: 9, 4: 8}
    assert position_benchmark(rows).conditions(rows[0]) == [f"{CORRECT}, {bin_label(3)}"]
    summary = position_summary([r for r in rows if r["press"] != "h2o" or r["probe"] != 4])
    cells = summary.set_index(["condition", "budget", "press"])
    late, middle = bin_label(2), bin_label(5)
    expected = {  # (condition, k, press): (mean %, n) counted by hand from the table above
        (f"{CORRECT}, {late}", 2, RECENCY): (0.0, 1),
        (f"{CORRECT}, {late}", 2, "demonstrated utility"): (100.0, 1),
        (f"{CORRECT}, {late}", 4, RECENCY): (100.0, 1),
        (f"{INCORRECT}, {late}", 4, "demonstrated utility"): (0.0, 1),
        (f"{CORRECT}, {middle}", 4, RECENCY): (0.0, 2),
        (f"{CORRECT}, {middle}", 4, "demonstrated utility"): (50.0, 2),
        (f"{CORRECT}, {middle}", 4, "h2o"): (100.0, 1),
        (f"{INCORRECT}, {bin_label(9)}", 2, "demonstrated utility"): (0.0, 1),
    }
    for (condition, k, press), (mean, n) in expected.items():
        cell = cells.loc[(condition, top_label(k), press)]
        assert (cell["mean"], cell["n"]) == (pytest.approx(mean), n)
    conditions = list(dict.fromkeys(summary["condition"]))
    old = bin_label(9)
    assert conditions == [f"{CORRECT}, {late}", f"{CORRECT}, {middle}", f"{INCORRECT}, {late}", f"{INCORRECT}, {old}"]
