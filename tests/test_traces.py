"""The eviction lab: traces equal the model's attention, each policy selects what its press selects, the
replay and Belady follow their rules, the controlled model matches its theory, and the protocol runs end to
end."""

from __future__ import annotations

import csv
import itertools
import json

import numpy as np
import pytest
import torch
from kvpress import ObservedAttentionPress, SnapKVPress, StreamingLLMPress
from kvpress.utils import compute_n_kept

from evaluation.cli.main import main
from evaluation.protocols.traces import controlled
from evaluation.protocols.traces.policies import (
    LAG_SWEEP,
    BeladyPolicy,
    LayerTrace,
    PressPolicy,
    StreamedPolicy,
    SummedH2OPolicy,
    WindowedRMMPolicy,
    default_policies,
    lag_control,
    lag_sweep,
    recent_h2o,
    seed_h2o,
    sweep_name,
)
from evaluation.protocols.traces.record import Trace, record
from evaluation.protocols.traces.replay import replay
from evaluation.protocols.traces.tova_claims import tova_claims, tova_table
from evaluation.protocols.traces.work import metric_rows, summary_row
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


def smoother_by_hand(rows: torch.Tensor, correct: list[float], lag: int | None, budget: int) -> list[int]:
    """Eq. 1 and the commit rule on one group's trace rows, step by step, at the press's timing: row t adds
    a(t -> k) to the held k of its window (k < t <= k + lag; ``lag=None``: k <= t, each score then the mean over
    the rows counted) as if correct until position t + 1 arrives, w(t) a(t -> k) from then on; once over budget,
    keep the lag newest and the best others (a newcomer must outrank an incumbent: ties keep the older)."""
    length, buffer = rows.shape[0], lag or 0
    held, settled, pending = [], {}, {}

    def counted(k: int, t: int) -> bool:
        return k <= t if lag is None else k < t <= k + lag

    for t in range(length):
        for k, share in pending.items():  # position t arrives: row t - 1's correctness is known
            settled[k] += correct[t - 1] * share
        held.append(t)
        settled[t] = 0.0
        pending = {k: float(rows[t, k]) for k in held if counted(k, t)}
        if len(held) > budget:
            ranking = {k: settled[k] + pending.get(k, 0.0) for k in held}
            if lag is None:
                ranking = {k: score / (t - k + 1) for k, score in ranking.items()}
            provisional = [k for k in held if t - k < buffer]
            others = sorted((k for k in held if t - k >= buffer), key=lambda k: (ranking[k], -k))
            held = sorted(provisional + others[-(budget - len(provisional)) :])
    return held


@pytest.mark.parametrize("lag", [None, 0, 1, 4, 16])
def test_the_lag_sweep_replays_the_press_smoother(trace_and_ids, lag):
    """``rmm`` and ``rmm(lag=H)`` run RMMPress one arrival at a time; what they hold matches Eq. 1 replayed by
    hand, each row counted as correct until the next position arrives."""
    _, _, trace = trace_and_ids
    correct = torch.randint(0, 2, (LENGTH,), generator=torch.Generator().manual_seed(6)).float()  # half right
    stacked = LayerTrace(torch.cat(trace.layers), correct)
    result = replay(stacked, StreamedPolicy(sweep_name(lag), lag), 40)
    for group in range(stacked.groups):
        expected = smoother_by_hand(stacked.rows[group].double(), correct.tolist(), lag, 40)
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


def test_heavy_hitter_recall_rewards_summed_attention_in_hindsight_not_the_requests_served():
    """Position 0 is attended heavily early, then never again; 1 is used at steps 2 and 3, 2 at step 3. The B = 2
    heavy hitters (summed attention 1.95 and 1.0) are 0 and 1. Belady evicts 0 at step 2 (no later use) and 1 at
    step 3 (nothing is used after it; ties: the lower) and serves all 3 requests, holding neither heavy hitter; the
    seed's summed H2O (no window) evicts 2 (0.45) then 3 (0.3), holds both and misses step 3's request for 2."""
    trace = hand_trace([[1.0, 0, 0, 0], [0.9, 0.1, 0, 0], [0.05, 0.5, 0.45, 0], [0.0, 0.4, 0.3, 0.3]])
    belady, summed = replay(trace, BeladyPolicy(), 2), replay(trace, SummedH2OPolicy(seed_h2o(0), 0), 2)
    assert belady.held[0].tolist() == [False, False, True, True] and summed.held[0].tolist() == [
        True,
        True,
        False,
        False,
    ]
    assert (belady.hit_rate.item(), belady.heavy_hitter_recall.item()) == (1.0, 0.0)
    assert (summed.hit_rate.item(), summed.heavy_hitter_recall.item()) == (pytest.approx(2 / 3), 1.0)


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
    # per trace: a summary, then 3 metrics x (8 policies x 2 budgets + the lags 0, 1, 4, 16 at 64 and up to 64 at
    # 96 + their commit-lag controls, the lags above 0)
    assert len(rows) == 2 * (1 + 3 * (8 * 2 + 4 + 5 + 3 + 4))
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
    assert "Traces retained_mass" in card and "tova" in card and lag_control(16) in card


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--texts", "wikipedia:3"], "text 'wikipedia:3' must be multi_news:N, locomo:SAMPLE_ID or essays:N"),
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


def control_by_hand(rows: np.ndarray, correct: np.ndarray, window: int, budget: int) -> list[int]:
    """RMM's full-horizon score at the press's timing, the sum over t' = k..t - 1 of w(t') a(t' -> k) plus
    a(t -> k) (row t counts as correct until t + 1 arrives) divided by t - k + 1, with the ``window`` newest
    protected: each step evicts the lowest-scored older position, ties the newer one."""
    held = list(range(budget))
    for t in range(budget, len(rows)):
        held.append(t)
        score = {k: float(correct[k:t] @ rows[k:t, k] + rows[t, k]) / (t - k + 1) for k in held}
        older = [k for k in held if t - k >= window]
        low = min(score[k] for k in older)
        held.remove(max(k for k in older if score[k] == low))
    return held


# A hand-built trace: integer weights per row (normalized), correctness per row; no two scores tie
CONTROL_WEIGHTS = [
    [5, 0, 0, 0, 0, 0, 0, 0],
    [3, 3, 0, 0, 0, 0, 0, 0],
    [6, 5, 1, 0, 0, 0, 0, 0],
    [8, 3, 5, 8, 0, 0, 0, 0],
    [9, 2, 4, 4, 9, 0, 0, 0],
    [1, 7, 1, 3, 5, 5, 0, 0],
    [7, 9, 1, 7, 3, 5, 9, 0],
    [7, 2, 3, 9, 4, 5, 3, 2],
]
CONTROL_CORRECT = [0, 1, 0, 1, 0, 1, 1, 1]


def test_the_commit_lag_control_is_rmms_full_horizon_score_with_the_lags_newest_protected():
    """At H = 2 it holds what the rule by hand holds, which neither ``rmm(lag=2)`` (windowed utility) nor H2O's
    window (uncorrected attention) holds; at H = 0 it is ``rmm`` (``lag=None``) itself, the press streamed."""
    weights = np.array(CONTROL_WEIGHTS, dtype=float)
    rows, correct = weights / weights.sum(1, keepdims=True), np.array(CONTROL_CORRECT, dtype=float)
    trace = LayerTrace(torch.tensor(rows[None], dtype=torch.float32), torch.tensor(correct, dtype=torch.float32))
    budget, lag = 4, 2

    def held(policy) -> list[int]:
        return replay(trace, policy, budget).held[0].nonzero()[:, 0].tolist()

    control = held(WindowedRMMPolicy(lag_control(lag), lag))
    assert control == control_by_hand(rows, correct, lag, budget) == [1, 3, 6, 7]
    assert held(StreamedPolicy(sweep_name(lag), lag)) == [0, 4, 6, 7]
    assert held(PressPolicy.of(recent_h2o(lag))) == [0, 1, 6, 7]
    at_zero = held(WindowedRMMPolicy(lag_control(0), 0))
    assert at_zero == control_by_hand(rows, correct, 0, budget) == held(StreamedPolicy("rmm", None)) == [1, 3, 5, 6]


def test_the_lag_sweep_runs_each_lags_control_beside_it():
    names = [policy.name for policy in lag_sweep()]
    assert names == [sweep_name(lag) for lag in LAG_SWEEP] + [lag_control(lag) for lag in LAG_SWEEP if lag]
    assert WindowedRMMPolicy(lag_control(64), 64).refusal(64) and not WindowedRMMPolicy("c", 63).refusal(64)


def summed_h2o_by_hand(rows: np.ndarray, window: int, budget: int) -> tuple[list[int], float]:
    """The TOVA seed's H2O replayed by hand on one group's rows: at step t each held position scores the sum of
    its column over rows 0..t, the ``window`` newest never go, the lowest other goes (ties: the lower position).
    What it holds at the end and its retained mass."""
    held, mass = list(range(budget)), 0.0
    for t in range(budget, len(rows)):
        held.append(t)
        mass += rows[t, held].sum()
        summed = rows[: t + 1].sum(0)
        held.remove(min((k for k in held if t - k >= window), key=lambda k: (summed[k], k)))
    return held, mass / (len(rows) - budget)


def test_the_seeds_h2o_sums_attention_and_protects_its_window_as_replayed_by_hand():
    """On the hand-built trace, ``SummedH2OPolicy`` holds and retains what summed attention with the W newest
    protected holds by hand, at W = 2, 1 and 0 (which evicts each newcomer, whose sum is its own row's weight);
    averaging (the lab's ``h2o``) with the same window holds something else at W = 1."""
    weights = np.array(CONTROL_WEIGHTS, dtype=float)
    rows = weights / weights.sum(1, keepdims=True)
    trace = LayerTrace(torch.tensor(rows[None], dtype=torch.float32), torch.ones(len(rows)))
    budget = 4
    for window, expected in ((2, [0, 1, 6, 7]), (1, [0, 1, 3, 7]), (0, [0, 1, 2, 3])):
        result = replay(trace, SummedH2OPolicy(seed_h2o(window), window), budget)
        held, mass = summed_h2o_by_hand(rows, window, budget)
        assert result.held[0].nonzero()[:, 0].tolist() == held == expected, window
        assert result.retained_mass.item() == pytest.approx(mass, abs=1e-6), window
    assert replay(trace, PressPolicy.of(recent_h2o(1)), budget).held[0].nonzero()[:, 0].tolist() == [0, 1, 4, 7]
    assert SummedH2OPolicy(seed_h2o(64), 64).refusal(64) and not SummedH2OPolicy(seed_h2o(63), 63).refusal(64)


def claims_by_hand(rows: np.ndarray, budget: int, window: int, threshold: float) -> dict[str, dict[str, float]]:
    """TOVA (the newest row's attention), the seed's H2O (attention summed over the rows that saw a position, the
    ``window`` newest protected), KVPress's H2O (that sum as a mean over those rows) and Belady (the farthest next
    step giving at least ``threshold``) replayed by hand on one group's rows: retained mass, heavy-hitter recall
    and the shares of the 64 newest and 4 first positions held at the end."""
    length = len(rows)
    cumulative = rows.sum(0)
    heavy = set(np.argsort(-cumulative, kind="stable")[:budget].tolist())

    def summed(t: int) -> np.ndarray:
        return rows[: t + 1].sum(0)

    def averaged(t: int) -> np.ndarray:
        return summed(t) / np.maximum(t + 1 - np.arange(length), 1)

    def next_use(t: int) -> np.ndarray:
        return -np.array(
            [next((s for s in range(t + 1, length) if rows[s, k] >= threshold), length) for k in range(length)]
        )

    scores = {"tova": (lambda t: rows[t], 0), "seed": (summed, window), "h2o": (averaged, 0), "belady": (next_use, 0)}
    found = {}
    for name, (score, protected) in scores.items():
        held, mass = list(range(budget)), 0.0
        for t in range(budget, length):
            held.append(t)
            mass += rows[t, held].sum()
            now = score(t)
            held.remove(min((k for k in held if t - k >= protected), key=lambda k: (now[k], k)))
        found[name] = {
            "mass": mass / (length - budget),
            "recall": len(heavy & set(held)) / budget,
            "recent": len([k for k in held if k >= length - 64]) / 64,
            "first": len([k for k in held if k < 4]) / 4,
        }
    return found


def test_the_tova_claims_tables_measure_the_seeds_figures_against_both_h2os_as_replayed_by_hand():
    """A trace whose steps look at 4 sinks and their recent positions, and early on at old heavy hitters that H2O
    keeps: the tables' masses, recalls and held shares are those replayed by hand, one table against the seed's H2O
    (summed, 32 newest protected), one against KVPress's (averaged), each difference TOVA's mass minus that H2O's,
    Belady's recall beside theirs."""
    length, budget, window = 100, 72, 32
    rng = np.random.default_rng(5)
    age = np.arange(length)[:, None] - np.arange(length)[None, :]
    logits = rng.random((length, length)) + 3.0 * (np.arange(length) < 4) + 2.0 * (age < 64) * np.exp(-age / 40)
    logits[:60, 10:26] += 3.0  # heavy hitters of the first 60 steps, ignored afterwards
    rows = np.where(age >= 0, np.exp(logits), 0.0)
    rows /= rows.sum(1, keepdims=True)
    trace = Trace("hand", list(range(length)), torch.ones(length), [torch.tensor(rows[None], dtype=torch.float32)])
    stacked = LayerTrace(torch.cat(trace.layers), trace.correct)
    out = [summary_row(trace, "multi_news:0", stacked)]
    policies = [p for p in default_policies(window) if p.name in ("tova", "h2o", seed_h2o(window), "belady")]
    assert len(policies) == 4
    for policy in policies:
        out += metric_rows(trace, policy, budget, replay(stacked, policy, budget))
    (claim,) = tova_claims(out, [budget], window)
    expected = claims_by_hand(rows, budget, window, stacked.threshold)
    share = np.mean([rows[t, max(0, t - 63) : t + 1].sum() for t in range(length)])
    assert claim.text == "multi_news:0"
    assert claim.recent_share == pytest.approx(share, abs=1e-6)
    for name in ("tova", "seed", "h2o"):
        assert getattr(claim, f"{name}_mass") == pytest.approx(expected[name]["mass"], abs=1e-5), name
        for figure in ("recall", "recent", "first"):
            assert getattr(claim, f"{name}_{figure}") == pytest.approx(expected[name][figure]), (name, figure)
    assert claim.belady_recall == pytest.approx(expected["belady"]["recall"])
    assert claim.tova_recent == claim.tova_first == 1.0 > claim.seed_recent, "TOVA holds the sinks and the newest"
    assert claim.seed_mass != pytest.approx(claim.h2o_mass, abs=1e-3), "summing and averaging differ here"
    table = "\n".join(tova_table([claim], window))
    assert f"Against the seed's H2O, `{seed_h2o(window)}`:" in table and "Against KVPress's H2O, `h2o`:" in table
    seed_row, h2o_row = (
        [c.strip() for c in line.strip("|").split("|")]
        for line in table.splitlines()
        if line.startswith("| multi_news:0 |")
    )
    for cells, name in ((seed_row, "seed"), (h2o_row, "h2o")):
        mass, by_hand = expected[name]["mass"], expected[name]
        assert cells[:4] == ["multi_news:0", claim.budget, f"{share:.3f}", f"{expected['tova']['mass']:.3f}"]
        assert cells[4:6] == [f"{mass:.3f}", f"{expected['tova']['mass'] - mass:+.3f}"], name
        assert cells[7:9] == [f"{by_hand['recall']:.3f}", f"{expected['belady']['recall']:.3f}"], name
        assert cells[10] == f"{by_hand['recent']:.3f}" and cells[12] == f"{by_hand['first']:.3f}", name
