"""RMM's random-weight control (``correctness="random"``) against truths computed here: the teacher-forced
correctness of a plain forward, the control's rule written out row by row, KVPress's ObservedAttentionPress, and
the harness's protocols run end to end."""

from __future__ import annotations

import json

import pytest
import torch
from kvpress import ObservedAttentionPress

import evaluation.engine.history as history_module
from evaluation.catalogue.needs import needs
from evaluation.catalogue.registry import SHARED
from evaluation.catalogue.resolved import make_press, resolve_presses
from evaluation.cli.main import main
from evaluation.engine.history import History
from evaluation.errors import EvaluationError
from evaluation.protocols.perplexity.stream import decoding_press, streamed_nll
from presses import RMMPress
from presses.column_sums import ColumnSums
from presses.random_weights import PAGE, uniforms
from tests.helpers import history_kept, kept_positions, same_sets, saved_chat_model, tiny_model
from tests.test_locomo_protocol import CONVERSATION
from tests.test_longbench_protocol import data_dir, longbench  # noqa: F401

LENGTH = 96


@torch.no_grad()
def mixed_ids(model, length: int = LENGTH, replaced: float = 0.3, seed: int = 3) -> torch.Tensor:
    """The model's own greedy text with about ``replaced`` of its tokens replaced at random: the model is right on
    some rows and wrong on others."""
    first = torch.tensor([[5]])
    ids = model.generate(first, attention_mask=torch.ones_like(first), max_new_tokens=length - 1, do_sample=False)
    generator = torch.Generator().manual_seed(seed)
    swapped = torch.rand(length, generator=generator) < replaced
    ids[0, swapped] = torch.randint(3, 256, (int(swapped.sum()),), generator=generator)
    return ids


@torch.no_grad()
def plain_correctness(model, ids: torch.Tensor) -> list[float]:
    """1.0 where a plain forward's top-1 prediction at row t is token t + 1, for every row but the last."""
    predicted = model(input_ids=ids).logits.argmax(-1)[0, :-1]
    return (predicted == ids[0, 1:]).float().tolist()


def rule(correct: list[float | None], block: int, seed: int) -> list[float]:
    """The control written out: a row not teacher-forced (None) weighs 1; of the forced rows before ``block``, the
    as many as are correct with the smallest draws weigh 1; a later row weighs 1 when its draw is below the share
    of correct forced rows before it (1 before any). ``correct`` has one entry per row, the last row's unread."""
    draws = uniforms(seed, len(correct)).tolist()
    members = [t for t in range(block) if correct[t] is not None]
    right = sum(correct[t] for t in members)
    chosen = set(sorted(members, key=lambda t: draws[t])[: int(right)])
    weights, counted, correct_before = [], 0, 0.0
    for t, value in enumerate(correct):
        if value is None:
            weights.append(1.0)
            continue
        share = correct_before / counted if counted else 1.0
        weights.append(float(t in chosen) if t < block else float(draws[t] < share))
        counted, correct_before = counted + 1, correct_before + value
    return weights


def scores(model, ids: torch.Tensor, press: RMMPress) -> list[torch.Tensor]:
    with torch.no_grad(), press(model):
        model(input_ids=ids)
    return [press._follower.smoothers[layer].scores() for layer in range(len(model.model.layers))]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", "sdpa", head_dim=16)


@pytest.fixture(scope="module")
def ids(model) -> torch.Tensor:
    return mixed_ids(model)


def test_each_draw_depends_on_the_seed_and_its_position_alone():
    long = uniforms(7, 2 * PAGE + 5)
    assert torch.equal(uniforms(7, 10), long[:10]) and torch.equal(uniforms(7, PAGE + 3), long[: PAGE + 3])
    assert not torch.equal(uniforms(8, 10), uniforms(7, 10))
    assert long.dtype == torch.float64 and long.min() >= 0 and long.max() < 1


@pytest.mark.parametrize("lag", [None, 4])
def test_a_prefill_weighs_a_seeded_permutation_of_its_correctness(model, ids, lag):
    """Exactly as many of the prefill's rows weigh 1 as the model predicts correctly, not the same rows, and the
    press scores as it does with the rule's weights supplied per position."""
    correct = plain_correctness(model, ids)
    assert 0.1 < sum(correct) / len(correct) < 0.9, "the model is right on some rows and wrong on others"
    weights = rule([*correct, 0.0], LENGTH - 1, seed=0)
    assert sum(weights[:-1]) == sum(correct) and weights[:-1] != correct
    ours = scores(model, ids, RMMPress(lag=lag, correctness="random"))
    supplied = scores(model, ids, RMMPress(lag=lag, correctness=weights))
    for a, b in zip(ours, supplied, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("lag", [None, 4])
def test_the_seed_chooses_the_rows_and_the_control_is_neither_rmm_nor_h2o(model, ids, lag):
    def kept(**fields):
        return kept_positions(model, ids, RMMPress(0.5, lag=lag, **fields))

    control = kept(correctness="random")
    assert same_sets(control, kept(correctness="random", seed=0))
    assert not same_sets(control, kept(correctness="random", seed=1))
    assert not same_sets(control, kept()) and not same_sets(control, kept(correctness="uniform"))
    if lag is None:
        eager = tiny_model("llama", "eager", head_dim=16)
        h2o = kept_positions(eager, ids, ObservedAttentionPress(0.5))
        assert not same_sets(kept_positions(eager, ids, RMMPress(0.5, correctness="random")), h2o)


def test_where_every_row_is_correct_the_control_keeps_what_h2o_keeps(model):
    ids = mixed_ids(model, replaced=0.0)
    assert plain_correctness(model, ids) == [1.0] * (LENGTH - 1), "the model's own greedy text"
    eager = tiny_model("llama", "eager", head_dim=16)
    for ratio in (0.25, 0.5):
        control = kept_positions(eager, ids, RMMPress(ratio, correctness="random"))
        assert same_sets(control, kept_positions(eager, ids, ObservedAttentionPress(ratio)))


@pytest.mark.parametrize("lag", [None, 4])
@pytest.mark.parametrize("forward", [LENGTH, 32])
def test_the_engine_keeps_what_the_press_keeps_in_any_number_of_forwards(model, ids, lag, forward, monkeypatch):
    """The shared prefill, one forward or three (its block weighed before its first forward's sums), leaves what
    a prefill under the press leaves; its weights are the rule's."""
    monkeypatch.setattr(history_module, "EXTEND_CHUNK", forward)
    press = RMMPress(0.5, lag=lag, correctness="random")
    history = History(model, frozenset({"context"}), [press])
    history.extend(ids[0].tolist(), "context")
    assert history.weights["random(seed=0)"] == rule([*plain_correctness(model, ids), 0.0], LENGTH - 1, 0)
    assert same_sets(history_kept(history, press), kept_positions(model, ids, press))


@pytest.mark.parametrize("kinds", [frozenset({"context", "answer"}), frozenset({"answer"})])
def test_a_growing_history_draws_its_later_rows_at_the_running_correct_share(model, ids, kinds):
    """The first extension is the block; the rows after it weigh 1 at the running share of the teacher-forced
    rows before them (rows of other kinds weigh 1), and the press keeps what a prefill of the whole history under
    these weights supplied keeps."""
    press = RMMPress(0.5, lag=4, correctness="random", seed=5)
    history = History(model, kinds, [press])
    history.extend(ids[0, :60].tolist(), "context")
    history.extend(ids[0, 60:].tolist(), "answer")
    correct = [*plain_correctness(model, ids), 0.0]
    forced = [None if t < 60 and "context" not in kinds else value for t, value in enumerate(correct)]
    expected = rule(forced, 59, seed=5)
    assert history.weights["random(seed=5)"] == expected
    supplied = RMMPress(0.5, lag=4, correctness=expected)
    assert same_sets(history_kept(history, press), kept_positions(model, ids, supplied))


def test_a_stream_draws_each_row_at_the_running_share_of_the_rows_before_it(model, ids):
    """Streamed one token per forward (the perplexity protocol), every row is drawn at the running share of the
    correctness the stream itself records; the same weights supplied give the same NLLs."""
    press = RMMPress(correctness="random")
    control = streamed_nll(model, ids, decoding_press(press, 40), 1)
    correct, settled, _ = press._transcript.correctness_table(LENGTH)
    assert settled[0, :-1].all()
    weights = rule(correct[0].tolist(), 0, seed=0)
    supplied = streamed_nll(model, ids, decoding_press(RMMPress(correctness=weights), 40), 1)
    assert torch.equal(control, supplied)
    assert not torch.equal(control, streamed_nll(model, ids, decoding_press(RMMPress(), 40), 1))


def test_the_spec_names_the_seed_and_is_served_on_the_shared_path():
    default, seeded = resolve_presses(["rmm(correctness='random')", "rmm(lag=64,correctness='random',seed=3)"])
    assert default.needs.path == seeded.needs.path == SHARED
    assert default.needs.sums == {ColumnSums(None, "random", 0)} and seeded.needs.sums == {ColumnSums(64, "random", 3)}
    assert seeded.label == "rmm(lag=64,correctness='random',seed=3)" and seeded.commit_lag == 64
    press = make_press("rmm(correctness='random',seed=3)", 0.5)
    assert press == RMMPress(0.5, correctness="random", seed=3) and needs(press).rows == 0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("rmm(seed=3)", "seed draws the weights of correctness='random'"),
        ("rmm(correctness='random',seed=-1)", r"seed must be a whole number in \[0, 4294967296\)"),
        ("rmm(correctness='random',seed=True)", "seed is a whole number"),
        ("rmm(correctness='random',fused_attention=True)", "before the weights of correctness='random' exist"),
    ],
)
def test_a_seed_without_the_control_or_out_of_range_is_refused(spec, message):
    with pytest.raises(EvaluationError, match=message):
        resolve_presses([spec])


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return saved_chat_model(tmp_path_factory.mktemp("tiny-llama"), "llama", context=8192)


CONTROL = "rmm(correctness='random')"


def rows_of(output) -> list[dict]:
    return [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]


def test_longbench_runs_the_control_shared_and_likelihood_only(chat_model, data_dir, tmp_path):  # noqa: F811
    for extra in ((), ("--likelihood-only",)):
        output = tmp_path / f"run{len(extra)}"
        assert longbench(chat_model, data_dir, output, "--presses", "full", CONTROL, "--n", "1", *extra) == 0
        rows = [row for row in rows_of(output) if row["press"] == CONTROL]
        assert rows and not any(row.get("error") for row in rows)
        paths = json.loads((output / "run.json").read_text())["config"]["paths"]
        assert paths[CONTROL] == "shared prefill: its own hook on the stored inputs"


@pytest.mark.parametrize(
    "argv",
    [
        ["locomo", "--rmm-weights", "all", "--budgets", "200", "--max-new-tokens", "3"],
        ["reuse", "--episodes", "1", "--sessions", "2", "--facts", "2", "--lag", "1", "--budgets", "300"],
        ["memory", "--episodes", "1", "--budget-facts", "5", "--multiples", "1", "--queries", "1", "--budgets", "200"],
        ["perplexity", "--texts", "--length", "48", "--budgets", "16"],
    ],
    ids=lambda argv: argv[0],
)
def test_the_streaming_protocols_run_the_control(chat_model, tmp_path, argv):
    data = []
    if argv[0] == "locomo":
        (tmp_path / "locomo10.json").write_text(json.dumps([CONVERSATION]))
        data = ["--data", str(tmp_path / "locomo10.json")]
    if argv[0] == "perplexity":
        (tmp_path / "text.txt").write_text("a text of my own, long enough to stream through the tiny model. " * 4)
        data = ["--text-file", str(tmp_path / "text.txt")]
    output = tmp_path / "run"
    presses = ["--presses", "full", "rmm", CONTROL]
    assert main([*argv, "--model", str(chat_model), "--output", str(output), *data, *presses]) == 0
    rows = [row for row in rows_of(output) if row["press"] == CONTROL]
    assert rows and not any(row.get("error") for row in rows)
