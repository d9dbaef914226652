"""Power, Holm's correction, a lower-is-better metric and tallies that count each example once, against hand-computed
cases."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from evaluation.protocols.locomo.task import BENCHMARK as LOCOMO
from evaluation.reporting.conditions import ANSWER_NLL, Benchmark
from evaluation.reporting.intervals import holm, holm_verdict, paired
from evaluation.reporting.scorecard import plot_forest, scores_frame, summarize, wins_ties_losses, write_scorecard


def test_the_minimum_detectable_difference_by_hand():
    """Differences 1, 2, 3, 4: SD (ddof 1) sqrt(5/3) = 1.290994; (1.959964 + 0.841621) x 1.290994 / sqrt(4)."""
    reference = {i: 0.0 for i in range(4)}
    difference = paired({i: float(i + 1) for i in range(4)}, reference, "hand", 2_000, 0)
    assert difference.n == 4 and difference.sd == pytest.approx(1.290994, abs=1e-6)
    assert difference.detectable == pytest.approx(2.801585 * 1.290994 / 2, abs=1e-5)
    assert difference.detectable == pytest.approx(1.808413, abs=1e-5)


def test_holm_on_a_hand_case():
    """p 0.01, 0.04, 0.03, 0.005: sorted x 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running maximum 0.06."""
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm_verdict(+0.2, 0.03) == "win" and holm_verdict(+0.2, 0.06) == "tie"
    assert holm_verdict(+0.2, 0.03, higher_is_better=False) == "loss"


def test_the_p_value_is_the_sign_flip_tests_beside_the_bootstrap_interval():
    """40 non-zero differences: 10,000 random flips, none reaching the observed sum, p = 1 / 10,001."""
    rng = np.random.default_rng(1)
    reference = {i: 0.0 for i in range(40)}
    clear = paired({i: 0.5 + rng.normal(0, 0.1) for i in range(40)}, reference, "clear", 2_000, 0)
    assert clear.p == pytest.approx(1 / 10_001) and clear.verdict() == "win" and not clear.test.exact
    noise = paired({i: rng.normal(0, 0.1) for i in range(40)}, reference, "noise", 2_000, 0)
    assert noise.verdict() == "tie" and noise.p > 0.05


def nll_rows(press: str, shift: float, n: int = 30, prediction: str = "same") -> list[dict]:
    rng = np.random.default_rng(len(press))
    return [
        {
            "task": "t",
            "id": str(i),
            "press": press,
            "budget_label": "full" if press == "full" else "b",
            "score": 0.5,
            "prediction": prediction,
            "answer_nll": 2.0 + 0.1 * (i % 7) + shift + rng.normal(0, 0.01),
        }
        for i in range(n)
    ]


BENCH = Benchmark("B", lambda row: ["all"], lambda row: (row["task"], row["id"]), 1, 3, unit="share")


def test_a_lower_nll_is_a_win_and_the_same_predictions_do_not_make_it_identical():
    rows = nll_rows("full", 0) + nll_rows("h2o", 0) + nll_rows("better", -0.3) + nll_rows("worse", +0.3)
    summary = summarize(scores_frame(BENCH, rows), "h2o", resamples=1_000).set_index(["press"])
    nll = summary[summary["metric"] == ANSWER_NLL]
    score = summary[summary["metric"] == BENCH.score]
    assert nll.loc["better", "diff"] < 0 and nll.loc["better", "verdict"] == nll.loc["better", "holm_verdict"] == "win"
    assert nll.loc["worse", "diff"] > 0 and nll.loc["worse", "verdict"] == "loss"
    assert nll.loc["better", "full_verdict"] == "win"
    assert score.loc["better", "verdict"] == "identical", "the official score still pairs on predictions"


def test_likelihood_only_reports_the_nll_alone_lower_is_better(tmp_path):
    rows = [dict(row, score=row["answer_nll"]) for row in nll_rows("h2o", 0) + nll_rows("better", -0.3)]
    benchmark = Benchmark("B", BENCH.conditions, BENCH.example_id, 1, 3, measured=(ANSWER_NLL,))
    summary = summarize(scores_frame(benchmark, rows), "h2o", resamples=500)
    assert list(summary["metric"].unique()) == [ANSWER_NLL]
    write_scorecard(tmp_path, summary, "t", "note", "h2o")
    markdown = (tmp_path / "scorecard.md").read_text()
    assert "Metric: answer NLL (nats per token; lower is better)." in markdown
    assert "- better: 1 / 0 / 0 (Holm: 1 / 0 / 0)" in markdown and "| MDE |" in markdown


def locomo_rows(press: str, shift: float) -> list[dict]:
    """Four conversations of 15 questions, categories 1 to 5, the first question of each the first turn."""
    return [
        {
            "conversation": f"c{c}",
            "question_index": i,
            "turn": i,
            "category": 1 + i % 5,
            "evidence_visible": i % 2 == 0,
            "press": press,
            "budget_label": "full" if press == "full" else "512 tokens",
            "score": 0.4 + 0.05 * ((i + c) % 4) + shift,
        }
        for c in range(4)
        for i in range(15)
    ]


def test_tallies_count_each_question_once():
    """Every condition is a loss, but "overall (1-4)" holds every other condition's questions but the
    adversarial ones: the tally counts overall and adversarial, 2 losses, not one per overlapping row."""
    rows = locomo_rows("full", 0) + locomo_rows("h2o", 0) + locomo_rows("tova", -0.2)
    unclustered = replace(LOCOMO, cluster=None)  # four conversations: clustered, every verdict would be too few
    frame = scores_frame(unclustered, [{**row, "answer_nll": None} for row in rows])
    summary = summarize(frame, "h2o", resamples=500)
    tova = summary[summary["press"] == "tova"]
    assert set(tova["verdict"]) == {"loss", "too few"}  # the first turn holds 4 questions
    assert set(tova.loc[tova["tallied"], "condition"]) == {"overall (1-4)", "adversarial (5)"}
    assert tova.loc[tova["tallied"], "n"].sum() == 60, "each of the 60 questions counted once"
    assert wins_ties_losses(summary).loc["tova"].tolist() == [0, 0, 2]
    assert (tova["verdict"] == "loss").sum() > 2, "the untallied rows keep their verdicts"


def test_the_forest_draws_intervals_under_the_verdict_threshold_and_says_why(tmp_path):
    rows = nll_rows("full", 0, 5) + nll_rows("h2o", 0, 5) + nll_rows("better", -0.3, 5, "other")
    summary = summarize(scores_frame(BENCH, rows), "h2o", resamples=500)
    better = summary[summary["press"] == "better"]
    assert set(better.loc[better["metric"] == ANSWER_NLL, "verdict"]) == {"too few"}
    assert set(better.loc[better["metric"] == BENCH.score, "verdict"]) == {"no signal"}, "no interval to draw"
    forest = plot_forest(tmp_path / "forest.png", summary, "h2o")
    assert len(forest.axes) == 2 and all(axis.get_lines() for axis in forest.axes), "against h2o and the full cache"
    assert [axis.get_title() for axis in forest.axes] == [
        "answer NLL against h2o; no verdict: every comparison has under 10 clusters",
        "answer NLL against the full cache; no verdict: every comparison has under 10 clusters",
    ]
    labels = [axis.get_xlabel() for axis in forest.axes]
    assert all("(answer NLL, nats per token; lower is better; 95% paired bootstrap interval)" in x for x in labels)
