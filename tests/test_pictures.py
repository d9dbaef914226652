"""Scorecard pictures: the forest plot of differences against the reference and the absolute scores, with no
two pieces of text overlapping (matplotlib's own text extents) at 2 and at 12 presses."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from evaluation.reporting.scorecard import MARKERS, plot_forest, plot_scores, summarize

CONDITIONS = ["LongBench multi_news", "LoCoMo overall (1-4)", "LoCoMo later turns", "LoCoMo temporal (2)"]
BUDGETS = ["keep 50%", "keep 25%"]


def frame_for(presses: list[str]) -> pd.DataFrame:
    """Scores of 20 examples per cell; each press a little better or worse than h2o."""
    rng = np.random.default_rng(0)
    records = []
    for condition, budget, (index, press) in itertools.product(CONDITIONS, BUDGETS, enumerate(presses)):
        for example in range(20):
            score = 0.4 + 0.02 * (index - len(presses) / 2) + rng.normal(0, 0.05)
            records.append((condition, budget, press, (example,), score, False, None, 3, 1.0))
    for condition, example in itertools.product(CONDITIONS, range(20)):
        records.append((condition, "full", "full", (example,), 0.5 + rng.normal(0, 0.05), False, None, 3, 1.0))
    columns = ["condition", "budget", "press", "example", "score", "failed", "output", "digits", "ceiling"]
    return pd.DataFrame(records, columns=columns)


def overlapping_texts(figure) -> list[tuple[str, str]]:
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    undrawn = {  # a tick outside its axis' limits keeps a label that is never drawn
        id(tick.label1)
        for axes in figure.axes
        for axis in (axes.xaxis, axes.yaxis)
        for tick in axis.get_major_ticks()
        if not min(axis.get_view_interval()) <= tick.get_loc() <= max(axis.get_view_interval())
    }
    boxes = [
        (text.get_text(), text.get_window_extent(renderer))
        for text in figure.findobj(Text)
        if text.get_visible()
        and id(text) not in undrawn
        and text.get_text().strip()
        and text.get_window_extent(renderer).width > 0
    ]
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2) if box_a.overlaps(box_b)]


@pytest.mark.parametrize("count", [2, 12])
def test_pictures_have_no_overlapping_text(tmp_path, count):
    presses = ["h2o", *[f"press-{i}(lag={i})" for i in range(count - 1)]]
    summary = summarize(frame_for(presses), "h2o", resamples=200)
    scores = plot_scores(tmp_path / "scores.png", summary, ["full", *presses], BUDGETS)
    forest = plot_forest(tmp_path / "forest.png", summary, "h2o")
    assert overlapping_texts(scores) == []
    assert overlapping_texts(forest) == []
    verdicts = set(summary["verdict"]) - {"reference", "-"}
    assert verdicts <= {"win", "tie", "loss"} and verdicts
    height = forest.get_figheight()
    rows = 2 * len(CONDITIONS) * len(BUDGETS)  # against h2o, and against the full cache
    assert height < 0.5 * rows + 4, "sized to its content, readable on one page"


def test_the_forest_plot_draws_every_compared_press_with_its_interval(tmp_path):
    presses = ["h2o", "tova", "rmm"]
    summary = summarize(frame_for(presses), "h2o", resamples=200)
    forest = plot_forest(tmp_path / "forest.png", summary, "h2o")
    lines = [line for axis in forest.axes for line in axis.get_lines()]
    against_h2o, against_full = 2, 3  # tova and rmm against h2o; all three against the full cache
    drawn = sum(line.get_marker() in set(MARKERS) for line in lines)
    assert drawn == (against_h2o + against_full) * len(CONDITIONS) * len(BUDGETS)
    assert [axis.get_xlabel().split(" (")[0] for axis in forest.axes] == [
        "difference against h2o",
        "difference against the full cache",
    ]
    legend = [text.get_text() for text in forest.legends[0].get_texts()]
    assert legend == ["tova", "rmm", "h2o", "win", "tie", "loss", "too few (under 10 clusters): no verdict"]
    assert [axis.get_ylabel() for axis in forest.axes] == ["condition, budget"] * 2


def test_a_press_keeps_its_marker_in_both_pictures_and_the_forest_says_what_colours_mean(tmp_path):
    presses = ["full", "snapkv", "h2o", "tova"]
    summary = summarize(frame_for(presses[1:]), "h2o", resamples=200)
    scores = plot_scores(tmp_path / "scores.png", summary, presses, BUDGETS)
    forest = plot_forest(tmp_path / "forest.png", summary, "h2o", presses)

    def markers(figure) -> dict[str, str]:
        return {h.get_label(): h.get_marker() for h in figure.legends[0].legend_handles if h.get_label() in presses}

    assert set(markers(forest)) == {"snapkv", "tova", "h2o"}, "h2o against the full cache"
    assert markers(forest) == markers(scores) == {"snapkv": "o", "h2o": "s", "tova": "D"}
    assert "before Holm's correction" in forest.legends[0].get_title().get_text()


def test_a_run_without_the_reference_or_the_full_cache_is_compared_with_what_it_holds(tmp_path):
    from evaluation.reporting.scorecard import write_scorecard

    frame = frame_for(["snapkv", "tova"])
    summary = summarize(frame[frame["press"] != "full"], "h2o", resamples=200)
    assert set(summary["verdict"]) - {"win", "tie", "loss"} == {"reference"}
    write_scorecard(tmp_path, summary, "Run", "A note.", "h2o", ["snapkv", "tova"], BUDGETS)
    markdown = (tmp_path / "scorecard.md").read_text()
    assert "This run holds no h2o: every press is compared with snapkv." in markdown
    assert "## Against snapkv" in markdown and "| LoCoMo later turns | keep 25% | tova |" in markdown
    assert "## Against the full cache\n\nThis run holds no full cache (add `full` to --presses" in markdown


def test_a_forest_with_nothing_to_draw_says_why(tmp_path):
    frame = frame_for(["h2o"])
    summary = summarize(frame[frame["press"] != "full"], "h2o", resamples=200)
    forest = plot_forest(tmp_path / "forest.png", summary, "h2o")
    assert [t.get_text() for t in forest.texts] == ["nothing to draw: no press ran where h2o or the full cache ran"]
