"""The eviction lab: traces equal the model's attention, each policy selects what its press selects, the
replay and Belady follow their rules, the controlled model matches its theory, and the protocol runs end to
end."""

from __future__ import annotations

import csv
import itertools
import json

import pytest
import torch
from kvpress import ObservedAttentionPress, SnapKVPress, StreamingLLMPress
from kvpress.utils import compute_n_kept

from evaluation.cli.main import main
from evaluation.protocols.traces import controlled
from evaluation.protocols.traces.policies import BeladyPolicy, LayerTrace, PressPolicy, StreamedPolicy
from evaluation.protocols.traces.record import record
from evaluation.protocols.traces.replay import replay
from presses import TOVAPress
from presses.ordered_scorer_press import kept_indices
from tests.helpers import SHARED_DATA, kept_positions, tiny_model
from tests.test_longbench_protocol import model_dir  # noqa: F401

LENGTH = 96


@pytest.fixture
def trace_and_ids(arch):
    model = tiny_model(arch, "eager")
    ids = torch.randint(3, 256, (1, LENGTH), generator=torch.Generator().manual_seed(4))
    return model, ids, record(model, ids[0].tolist(), "tiny", per_kv_group=True)


def test_trace_rows_are_the_models_attention(trace_and_ids):
    model, ids, trace = trace_and_ids
    with torch.no_grad():
        outputs = model(input_ids=ids, output_attentions=True)
    for layer, attentions in zip(trace.layers, outputs.attentions, strict=True):
        expected = attentions[0].unflatten(0, (2, -1)).mean(1)  # (kv groups, length, length)
        assert torch.allclose(layer, expected, atol=1e-5)
    predicted = outputs.logits.argmax(-1)[0]
    assert trace.correct.tolist() == [*(predicted[:-1] == ids[0, 1:]).float().tolist(), 1.0]


@pytest.mark.parametrize(
    ("policy", "press"),
    [
        (PressPolicy("tova", TOVAPress()), TOVAPress),
        (PressPolicy("h2o", ObservedAttentionPress()), ObservedAttentionPress),
        (PressPolicy("snapkv", SnapKVPress()), SnapKVPress),
        (PressPolicy("streaming_llm", StreamingLLMPress()), StreamingLLMPress),
    ],
    ids=lambda value: getattr(value, "name", ""),
)
def test_each_policy_selects_what_its_press_keeps(trace_and_ids, policy, press):
    """One compression of the whole trace: the policy's scores at the last step keep the press's positions.

    72 of 96 kept: more than SnapKV's window of 64, whose positions all tie at its maximum score."""
    model, ids, trace = trace_and_ids
    n_kept = compute_n_kept(LENGTH, 0.25)
    pressed = kept_positions(model, ids, press(compression_ratio=0.25))
    for layer, rows in enumerate(trace.layers):
        policy.start(LayerTrace(rows, trace.correct), n_kept)
        scores = policy.scores(LayerTrace(rows, trace.correct), LENGTH - 1)
        ours = kept_indices(scores, n_kept)
        assert torch.equal(ours.sort(-1).values, pressed[layer][0].sort(-1).values), f"layer {layer}"


def smoother_by_hand(rows: torch.Tensor, correct: list[float], lag: int, budget: int) -> list[int]:
    """Eq. 1 and the commit rule on one group's trace rows, step by step: each row t adds w(t) a(t -> k) to
    the held k with k < t <= k + lag; once over budget, keep the lag newest and the best others (a newcomer must
    outrank an incumbent: ties keep the older)."""
    length = rows.shape[0]
    held, utility = [], {}
    for t in range(length):
        held.append(t)
        utility[t] = 0.0
        for k in held:
            if k < t <= k + lag:
                utility[k] += correct[t] * float(rows[t, k])
        if len(held) > budget:
            provisional = [k for k in held if t - k < lag]
            others = sorted((k for k in held if t - k >= lag), key=lambda k: (utility[k], -k))
            held = sorted(provisional + others[-(budget - len(provisional)) :])
    return held


@pytest.mark.parametrize("lag", [0, 1, 4, 16])
def test_the_lag_sweep_replays_the_press_smoother(trace_and_ids, lag):
    """``rmm(lag=H)`` runs RMMPress one arrival at a time; what it holds matches Eq. 1 replayed by hand."""
    _, _, trace = trace_and_ids
    stacked = LayerTrace(torch.cat(trace.layers), trace.correct)
    result = replay(stacked, StreamedPolicy(f"rmm(lag={lag})", lag), 40)
    for group in range(stacked.groups):
        expected = smoother_by_hand(stacked.rows[group].double(), trace.correct.tolist(), lag, 40)
        assert result.held[group].nonzero()[:, 0].tolist() == expected, f"group {group}"


def hand_trace(rows: list[list[float]]) -> LayerTrace:
    """A one-group trace from lower-triangular rows written out by hand."""
    return LayerTrace(torch.tensor([rows]), torch.ones(len(rows)), threshold=0.3)


def test_tova_evicts_what_the_newest_step_ignores_where_h2o_keeps_the_heavy_hitter():
    """The TOVA spec's distinguishing case: position 0 was heavily attended early, then ignored."""
    trace = hand_trace(
        [
            [1.0, 0, 0, 0],
            [0.9, 0.1, 0, 0],
            [0.05, 0.5, 0.45, 0],
            [0.0, 0.4, 0.3, 0.3],
        ]
    )
    tova = replay(trace, PressPolicy("tova", TOVAPress()), 2)
    h2o = replay(trace, PressPolicy("h2o", ObservedAttentionPress()), 2)
    # step 2 holds {0, 1, 2}: TOVA drops 0 (0.05), H2O drops 1 (its mean 0.3 under 0's 0.65 and 2's 0.45);
    # step 3: TOVA holds {1, 2, 3} and drops 2 (0.3), H2O holds {0, 2, 3} and drops 3 (0.3 under 0.4875, 0.375)
    assert tova.held[0].tolist() == [False, True, False, True]
    assert h2o.held[0].tolist() == [True, False, True, False]
    assert tova.retained_mass.item() == pytest.approx((1.0 + 1.0) / 2)
    assert h2o.retained_mass.item() == pytest.approx((1.0 + 0.6) / 2)


def test_belady_evicts_the_farthest_next_use_and_hits_every_request_it_can():
    trace = hand_trace(
        [
            [1.0, 0, 0, 0, 0],
            [0.5, 0.5, 0, 0, 0],
            [0.1, 0.1, 0.8, 0, 0],
            [0.6, 0.1, 0.2, 0.1, 0],
            [0.1, 0.5, 0.1, 0.1, 0.2],
        ]
    )
    belady = replay(trace, BeladyPolicy(), 2)
    # next uses at step 2: 0 -> 3, 1 -> 4, 2 -> never: evict 2; at step 3: 0 and 3 -> never, 1 -> 4: evict 0
    # (the lower of a tie); at step 4 nothing is used again: evict 1
    assert belady.held[0].tolist() == [False, False, False, True, True]
    assert belady.hit_rate.item() == 1.0
    assert replay(trace, PressPolicy("h2o", ObservedAttentionPress()), 2).hit_rate.item() < 1.0


def test_controlled_model_matches_its_theory():
    setting = controlled.PAPER_SETTING
    floor = setting.capacity / setting.items
    recalls = {policy: controlled.recall(policy, setting) for policy in controlled.POLICIES}
    assert recalls["smoother"] == recalls["belady"] == min(1, setting.capacity / setting.useful)
    assert abs(recalls["recency"] - floor) < 0.06 and abs(recalls["h2o"] - floor) < 0.06
    assert floor < recalls["predictor"] < recalls["smoother"]


def test_figure_2_shape_smoother_holds_while_recency_and_accumulation_decay():
    smoother = controlled.figure_2("smoother", seeds=5)
    assert min(smoother) == 1.0
    for policy in ("recency", "h2o"):
        retention = controlled.figure_2(policy, seeds=5)
        assert retention[0] == 1.0 and retention[-1] < 0.25, policy
        assert all(later <= earlier + 0.1 for earlier, later in itertools.pairwise(retention)), policy


def test_the_trace_protocol_runs_resumes_and_feeds_the_combined_scorecard(
    model_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    monkeypatch.setenv("KVET_CACHE", str(tmp_path / "cache"))
    output = tmp_path / "traces"
    argv = ["traces", "--model", str(model_dir), "--texts", "multi_news:0", "multi_news:1", "--length", "160"]
    argv += ["--budgets", "64", "96", "--data", str(SHARED_DATA), "--output", str(output)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    # per trace: a summary, then 3 metrics x (7 policies x 2 budgets + the lags 0, 1, 4, 16 at 64 and up to 64 at
    # 96 + their recency controls, the lags above 0 but 32, a default policy)
    assert len(rows) == 2 * (1 + 3 * (7 * 2 + 4 + 5 + 3 + 4))
    for name in (
        "scorecard.md",
        "scorecard.csv",
        "forest.png",
        "lag_sweep.png",
        "controlled.png",
        "controlled.json",
    ):
        assert (output / name).stat().st_size > 0
    with (output / "scorecard.csv").open() as handle:
        conditions = {line["condition"] for line in csv.DictReader(handle)}
    assert conditions == {"retained_mass", "heavy_hitter_recall", "hit_rate"}, "each metric is its own condition"
    belady = [r for r in rows if r["press"] == "belady" and r["metric"] == "hit_rate"]
    others = [r for r in rows if r["press"] != "belady" and r["metric"] == "hit_rate"]
    assert all(0 <= r["score"] <= 1 for r in rows if r["metric"] in ("hit_rate", "heavy_hitter_recall"))
    assert max(r["score"] for r in belady) > 0 and len(others) > 0
    summaries = [r for r in rows if r["metric"] == "summary"]
    assert [r["text"] for r in summaries] == ["multi_news:0", "multi_news:1"]
    assert all(len(r["recent_64_attention_share"]) == 2 and 0 <= r["teacher_forced_accuracy"] <= 1 for r in summaries)

    assert main(argv) == 0, "a finished run reruns nothing and reads the cached traces"
    again = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert again == rows
    assert json.loads((output / "run.json").read_text())["sessions"][1]["units_run"] == 0

    combined = ["scorecard", str(output), "--output", str(tmp_path / "cards" / "t")]
    assert main(combined) == 0
    card = (tmp_path / "cards" / "t" / "scorecard.md").read_text()
    assert "Traces retained_mass" in card and "tova" in card and "recent_window(h2o,window=16)" in card


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--texts", "wikipedia:3"], "trace text 'wikipedia:3' must be multi_news:N or locomo:SAMPLE_ID"),
        (["--texts", "multi_news:100000"], "multi_news has contexts 0.."),
        (["--texts", "locomo:conv-0"], "unknown LoCoMo conversation 'conv-0'"),
        (["--budgets", "32"], "budgets must be at least 64 (SnapKV's window) and below --length 160"),
        (["--length", "8192"], "--length 8192 is over 4096"),
        (["--length", "64"], "argument --length: 64 is below 65"),
        (["--threshold", "0"], "argument --threshold: 0 is outside (0, 1)"),
        (["--h2o-window", "64"], "--h2o-window 64 must be in [0, the smallest budget)"),
    ],
)
def test_bad_trace_options_get_a_clear_error(model_dir, tmp_path, monkeypatch, capsys, arguments, message):  # noqa: F811
    monkeypatch.setenv("KVET_CACHE", str(tmp_path / "cache"))
    base = {"--model": str(model_dir), "--length": "160", "--data": str(SHARED_DATA), "--budgets": "64"}
    base.update(dict(zip(arguments[::2], arguments[1::2], strict=True)))
    argv = ["traces", "--output", str(tmp_path / "out"), *[item for pair in base.items() for item in pair]]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
