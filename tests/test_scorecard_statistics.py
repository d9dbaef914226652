"""Bootstrap intervals, paired verdicts, and the cross-benchmark scorecard command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from evaluation.cli.main import main
from evaluation.reporting.intervals import bootstrap, paired

RNG = np.random.default_rng(0)
BASE = dict(enumerate(RNG.uniform(0.2, 0.6, size=40)))


def test_clear_win_clear_loss_and_exact_tie():
    better = {i: s + 0.3 + RNG.normal(0, 0.02) for i, s in BASE.items()}
    worse = {i: s - 0.25 for i, s in BASE.items()}
    win = paired(better, BASE, "win", 10_000, 0)
    assert win.verdict() == "win" and 0.28 < win.low < win.mean < win.high < 0.32
    loss = paired(worse, BASE, "loss", 10_000, 0)
    assert loss.verdict() == "loss" and loss.mean == pytest.approx(-0.25)
    tie = paired(dict(BASE), BASE, "tie", 10_000, 0)
    assert tie.verdict() == "tie" and (tie.low, tie.mean, tie.high) == (0.0, 0.0, 0.0)


def test_a_noisy_difference_around_zero_is_a_tie():
    noisy = {i: s + (0.05 if i % 2 else -0.05) for i, s in BASE.items()}
    assert paired(noisy, BASE, "noisy", 10_000, 0).verdict() == "tie"


def test_fixed_seed_is_deterministic_and_the_seed_matters():
    values = np.array(list(BASE.values()))
    assert bootstrap(values, 10_000, 7) == bootstrap(values, 10_000, 7)
    assert bootstrap(values, 10_000, 7) != bootstrap(values, 10_000, 8)
    interval = bootstrap(values, 10_000, 7)
    assert interval.low < values.mean() < interval.high and interval.mean == pytest.approx(values.mean())


def test_unpaired_examples_are_reported_not_dropped():
    partial = {i: s for i, s in BASE.items() if i != 3}
    with pytest.raises(ValueError, match=r"1 only in the reference, e\.g\. \[3\]; 0 only in the compared press"):
        paired(partial, BASE, "cell", 1_000, 0)


def write_run(folder: Path, rows: list[dict], protocol: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"config": {}, "sessions": [], "protocol": protocol}))
    (folder / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def longbench_rows(press: str, shift: float, ids: range) -> list[dict]:
    return [
        {"task": "hotpotqa", "id": f"q{i}", "press": press, "budget_label": "keep 50%", "score": BASE[i] + shift}
        for i in ids
    ]


def locomo_rows(press: str, shift: float) -> list[dict]:
    return [
        {
            "conversation": f"conv-{i % 20}",  # 20 conversations of 2 questions: a verdict needs 10
            "question_index": i,
            "press": press,
            "budget_label": "1800 tokens",
            "turn": i,
            "evidence_visible": i % 3 > 0,
            "placement": "file",
            "category": 1 + i % 5,
            "score": min(1.0, BASE[i] + shift),
        }
        for i in range(40)
    ]


def test_the_scorecard_command_across_benchmarks(tmp_path, capsys):
    longbench = write_run(
        tmp_path / "lb", longbench_rows("h2o", 0, range(40)) + longbench_rows("rmm", 0.2, range(40)), "longbench"
    )
    locomo = write_run(
        tmp_path / "lc", locomo_rows("h2o", 0) + locomo_rows("rmm", -0.2) + locomo_rows("tova", 0), "locomo"
    )
    argv = ["scorecard", str(longbench), str(locomo), "--output", str(tmp_path / "out" / "both")]
    assert main(argv) == 0
    markdown = (tmp_path / "out" / "both" / "scorecard.md").read_text()
    assert "- rmm: 1 / 0 / " in markdown, "a win on LongBench"
    assert "| LongBench hotpotqa | keep 50% | rmm |" in markdown and "| win |" in markdown
    assert "| LoCoMo overall (1-4) | 1800 tokens | rmm |" in markdown and "| loss |" in markdown
    # tova scores as h2o on every question (and these rows record no output): a [0, 0] interval is no tie
    assert "| LoCoMo overall (1-4) | 1800 tokens | tova |" not in markdown.split("## Against h2o")[1]
    assert "identical" in markdown.split("## Against h2o")[1].split("## Against the full cache")[0]
    assert "| LoCoMo later turns | 1800 tokens | " in markdown and "| h2o |" in markdown
    table = [line for line in markdown.splitlines() if line.startswith("| LoCoMo") or line.startswith("| LongBench")]
    assert not [line for line in table if line.startswith("| LoCoMo") and "| keep 50% |" in line]
    assert not [line for line in table if line.startswith("| LongBench") and "| 1800 tokens |" in line]
    assert (tmp_path / "out" / "both" / "forest.png").stat().st_size > 0
    assert (tmp_path / "out" / "both" / "scorecard.png").stat().st_size > 0
    assert main(argv) == 0
    assert (tmp_path / "out" / "both" / "scorecard.md").read_text() == markdown, "deterministic"


def test_the_scorecard_command_refuses_runs_that_disagree_on_examples(tmp_path, capsys):
    run = write_run(
        tmp_path / "lb", longbench_rows("h2o", 0, range(40)) + longbench_rows("rmm", 0.1, range(39)), "longbench"
    )
    assert main(["scorecard", str(run), "--output", str(tmp_path / "out")]) == 2
    assert (
        "the runs disagree on examples (1 only in the reference, e.g. [('hotpotqa', 'q39')]" in capsys.readouterr().err
    )


def verdict_frame(cells: dict[str, list[tuple[float, str]]], condition: str = "c") -> list[dict]:
    """Rows of one condition and budget: per press, (score, prediction) per example; the full cache too."""
    return [
        {
            "condition": condition,
            "budget": "full" if press == "full" else "b",
            "press": press,
            "example": (i,),
            "score": score,
            "failed": False,
            "output": output,
            "digits": 3,
            "ceiling": 1.0,
        }
        for press, values in cells.items()
        for i, (score, output) in enumerate(values)
    ]


def test_verdicts_say_what_the_pairs_carry():
    """identical (same outputs), no signal (both at the floor), too few (under 10 pairs), else the interval."""
    import pandas as pd

    from evaluation.reporting.scorecard import summarize

    n = 12
    varied = [(0.1 * (i % 5), f"a{i}") for i in range(n)]
    rows = verdict_frame(
        {
            "full": [(s + 0.5, o + "!") for s, o in varied],
            "h2o": varied,
            "same": varied,  # the same outputs as h2o in every pair
            "better": [(s + 0.4, f"b{i}") for i, (s, _) in enumerate(varied)],
        }
    )
    rows += verdict_frame({"full": [(0.0, "x")] * n, "h2o": [(0.0, "y")] * n, "zero": [(0.0, "z")] * n}, "floor")
    rows += verdict_frame(
        {"full": varied[:9], "h2o": varied[:9], "few": [(s + 0.4, "q") for s, _ in varied[:9]]}, "few"
    )
    # the same score as h2o in every pair, with other outputs: a [0, 0] interval, which says nothing either way
    rows += verdict_frame({"full": varied, "h2o": varied, "echo": [(s, o + "?") for s, o in varied]}, "echo")
    summary = summarize(pd.DataFrame(rows), "h2o", resamples=500).set_index(["condition", "press"])
    assert summary.loc[("c", "same"), "verdict"] == "identical"
    assert summary.loc[("c", "better"), "verdict"] == "win"
    assert summary.loc[("floor", "zero"), "verdict"] == "no signal"
    assert summary.loc[("echo", "echo"), "verdict"] == "no signal"
    few = summary.loc[("few", "few")]  # under 10 pairs: the interval is given, no verdict either way
    assert few["verdict"] == few["holm_verdict"] == "too few" and few["diff"] == pytest.approx(0.4)
    # against the full cache (its own budget row), every press at its condition: both lose here
    assert summary.loc[("c", "h2o"), "full_verdict"] == summary.loc[("c", "better"), "full_verdict"] == "loss"
    assert summary.loc[("c", "better"), "full_diff"] == pytest.approx(-0.1)
    assert summary.loc[("c", "h2o"), "full_diff"] == pytest.approx(-0.5)
    assert summary.loc[("floor", "h2o"), "full_verdict"] == "no signal"


def test_a_budget_that_holds_only_some_examples_pairs_with_the_full_cache_on_those():
    """A budget at or above an example's context is that example's full cache under its own label, so the budget's
    cell holds the other examples only: against the full cache it pairs on them."""
    import pandas as pd

    from evaluation.reporting.scorecard import summarize

    varied = [(0.1 * (i % 5), f"a{i}") for i in range(12)]
    rows = verdict_frame({"full": [(s + 0.5, o + "!") for s, o in varied], "h2o": varied, "tova": varied})
    rows = [r for r in rows if r["press"] == "full" or r["example"] != (0,)]
    rows += [r | {"budget": "b (over)"} for r in verdict_frame({"h2o": varied[:1], "tova": varied[:1]})]
    summary = summarize(pd.DataFrame(rows), "h2o", resamples=500).set_index(["budget", "press"])
    assert summary.loc[("b", "tova"), "full_verdict"] == "loss" and summary.loc[("b", "tova"), "n"] == 11
    assert summary.loc[("b", "tova"), "full_diff"] == pytest.approx(-0.5)
    assert summary.loc[("b (over)", "tova"), "full_verdict"] == "too few"


def test_a_condition_holding_exactly_another_conditions_rows_is_reported_once():
    from evaluation.reporting.conditions import Benchmark
    from evaluation.reporting.scorecard import scores_frame

    both = Benchmark(
        "B", lambda row: ["overall", "visible", *(["odd"] if row["i"] % 2 else [])], lambda r: r["i"], 1, 3
    )
    rows = [{"i": i, "budget_label": "b", "press": "p", "score": 0.5} for i in range(4)]
    assert list(dict.fromkeys(scores_frame(both, rows)["condition"])) == ["overall", "odd"]


def test_a_contrast_pairs_two_conditions_of_one_press_by_their_matched_pair():
    """Reused codes against their controls, paired by (conversation, pair): the difference is the mean of the
    pairs' differences (here 1 in 8 of 12 pairs, -1 in 2), not of the two conditions' unrelated examples."""
    from evaluation.catalogue.budgets import OVER_THE_CONTEXT
    from evaluation.reporting.conditions import Benchmark, Contrast
    from evaluation.reporting.scorecard import contrast_table

    reuse = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0]
    fresh = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0]
    rows = [
        {
            "conversation": f"c{i // 4}",
            "pair": i % 4,
            "kind": kind,
            "question_index": 2 * i + (kind == "fresh"),
            "press": "h2o",
            "budget_label": "256 tokens",
            "score": float(score),
            "prediction": f"{kind} {i}",
        }
        for i in range(12)
        for kind, score in (("reuse", reuse[i]), ("fresh", fresh[i]))
    ]
    benchmark = Benchmark(
        "Reuse",
        lambda row: [row["kind"]],
        lambda row: (row["conversation"], row["question_index"]),
        100,
        1,
        contrasts=(Contrast("reuse", "fresh", lambda row: (row["conversation"], row["pair"])),),
    )
    rows[1]["budget_label"] += OVER_THE_CONTEXT  # a pair's second question, asked later, may see a longer history
    (line,) = contrast_table(benchmark, rows).to_dict("records")
    # 8 pairs one way, 2 the other, 2 tied: the exact sign-flip p is 2 x (1 + 10 + 45) / 2^10, where the bootstrap's
    # twice-the-smaller-tail gave a win
    assert (line["contrast"], line["n"], line["verdict"]) == ("reuse - fresh", 12, "tie")
    assert line["p"] == pytest.approx(112 / 1024)
    assert line["diff"] == pytest.approx(100 * (8 - 2) / 12) and line["minuend"] == pytest.approx(100 * 9 / 12)
    assert line["diff_low"] > 0
    (few,) = contrast_table(benchmark, [r for r in rows if r["conversation"] == "c0"]).to_dict("records")
    assert (few["n"], few["verdict"]) == (4, "too few")
