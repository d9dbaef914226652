"""RecentWindowPress: H2O's heavy hitters plus its recent window, against the eager attention weights by hand and
KVPress's own ObservedAttentionPress; in the lab, a window of H protects exactly rmm(lag=H)'s provisional buffer."""

from __future__ import annotations

import pytest
import torch
from kvpress import ObservedAttentionPress
from kvpress.utils import compute_n_kept

from evaluation.catalogue.resolved import make_press, resolve_press
from evaluation.errors import EvaluationError
from evaluation.protocols.traces.policies import LayerTrace, PressPolicy, StreamedPolicy, recent_h2o
from evaluation.protocols.traces.replay import replay
from presses import RecentWindowPress
from tests.helpers import kept_positions, tiny_model

LENGTH = 48


@pytest.fixture(scope="module")
def eager_model():
    return tiny_model("llama", "eager")


IDS = torch.randint(3, 256, (1, LENGTH), generator=torch.Generator().manual_seed(7))


def kept_by_hand(model, window: int, n_kept: int) -> list[list[set[int]]]:
    """Per layer and KV head: the ``window`` newest positions, then the highest mean attention received (each
    column's sum over the rows that can see it, averaged over the head's query group) among the others."""
    with torch.no_grad():
        attentions = model(input_ids=IDS, output_attentions=True).attentions
    kept = []
    for weights in attentions:
        means = weights[0].sum(1) / torch.arange(LENGTH, 0, -1)  # (heads, length)
        per_group = means.unflatten(0, (2, -1)).mean(1)
        heads = []
        for scores in per_group:
            recent = set(range(LENGTH - window, LENGTH))
            others = sorted(set(range(LENGTH)) - recent, key=lambda k: (-float(scores[k]), -k))
            heads.append(recent | set(others[: n_kept - window]))
        kept.append(heads)
    return kept


@pytest.mark.parametrize("window", [0, 5, 20])
def test_it_keeps_the_window_and_the_heaviest_hitters_of_the_rest(eager_model, window):
    ratio = 0.5
    n_kept = compute_n_kept(LENGTH, ratio)
    ours = kept_positions(eager_model, IDS, RecentWindowPress(ObservedAttentionPress(ratio), window=window))
    expected = kept_by_hand(eager_model, window, n_kept)
    for layer, (positions, heads) in enumerate(zip(ours, expected, strict=True)):
        assert [set(p.tolist()) for p in positions[0]] == heads, f"layer {layer}"
    if window == 0:  # no window: KVPress's own H2O
        theirs = kept_positions(eager_model, IDS, ObservedAttentionPress(ratio))
        for mine, its in zip(ours, theirs, strict=True):
            assert torch.equal(mine.sort(-1).values, its.sort(-1).values)


def test_a_window_the_budget_cannot_hold_is_refused_before_any_work():
    press = make_press("recent_window(h2o, window=16)", 0.5)
    assert press.compression_ratio == 0.5 and press.press.compression_ratio == 0.5
    resolved = resolve_press("recent_window(h2o, window=16)")
    assert resolved.budget_refusal(17) == ""
    assert "use a window below 16" in resolved.budget_refusal(16)
    with pytest.raises(EvaluationError, match="window must be an integer >= 0"):
        make_press("recent_window(h2o, window=-1)")
    with pytest.raises(EvaluationError, match="ScorerPress"):
        make_press("recent_window(press=decoding(knorm))")
    for inner in ("pyramidkv", "rmm"):  # per-layer budgets, a smoother: their own compress, which score() bypasses
        with pytest.raises(EvaluationError, match="decides more than its scores"):
            make_press(f"recent_window(press={inner}, window=4)")


def hand_trace(length: int) -> LayerTrace:
    rows = torch.rand(1, length, length, generator=torch.Generator().manual_seed(3)).tril()
    return LayerTrace(rows / rows.sum(-1, keepdim=True), torch.ones(length))


@pytest.mark.parametrize("lag", [1, 4, 9])
def test_h2os_recent_window_of_a_lag_holds_rmms_buffer_and_ranks_the_rest_as_h2o(lag):
    """At every step both hold all of the lag's newest positions; the control's others are H2O's by hand."""
    length, budget = 40, 12
    trace = hand_trace(length)
    control = replay(trace, PressPolicy.of(recent_h2o(lag)), budget).held[0]
    rmm = replay(trace, StreamedPolicy(f"rmm(lag={lag})", lag, teacher_forced=False), budget).held[0]
    assert control[-lag:].all() and rmm[-lag:].all()
    held = list(range(budget))
    for t in range(budget, length):
        held.append(t)
        means = trace.rows[0, : t + 1, : t + 1].sum(0) / torch.arange(t + 1, 0, -1)
        older = [k for k in held if t - k >= lag]
        held.remove(min(older, key=lambda k: (float(means[k]), k)))
    assert control.nonzero()[:, 0].tolist() == held
