"""The incremental history equals a naive full re-prefill of the history under each press, turn after turn."""

from __future__ import annotations

import pytest
import torch

from evaluation.catalogue.budgets import Budget
from evaluation.catalogue.resolved import make_press
from evaluation.catalogue.specs import DEFAULT_PRESSES
from evaluation.engine import history as history_module
from evaluation.engine.decoding import decode
from evaluation.engine.history import History
from presses.attention import attention_rows
from presses.prefix import forward_capturing
from tests.helpers import (
    confidence_weights,
    confident_model,
    history_kept,
    implementation,
    kept_positions,
    prefill,
    same_sets,
    tiny_model,
)

TURNS = [("question", 9), ("answer", 5), ("question", 7), ("answer", 6), ("question", 8), ("answer", 4)]


def naive_weights(model, ids: torch.Tensor, kinds: list[str]) -> torch.Tensor:
    """RMM's row weights from one full forward: teacher-forced on answer rows, 1 elsewhere and on the last row."""
    with torch.no_grad():
        predicted = model(input_ids=ids).logits.argmax(-1)[0]
    correct = torch.cat([(predicted[:-1] == ids[0, 1:]).float(), torch.ones(1)])
    return torch.where(torch.tensor([kind == "answer" for kind in kinds]), correct, torch.ones_like(correct))


@pytest.mark.parametrize("name", [*DEFAULT_PRESSES[1:], "rmm(lag=8)"])
def test_incremental_kept_sets_and_answers_equal_a_naive_re_prefill(arch, name):
    generator = torch.Generator().manual_seed(7)
    model = tiny_model(arch, implementation(name))
    history = History(model, teacher_forced_kinds=frozenset({"answer"}), presses=[make_press(name, 0.5)])
    chunks = [("conversation", torch.randint(3, 256, (90,), generator=generator).tolist())]
    chunks += [(kind, torch.randint(3, 256, (size,), generator=generator).tolist()) for kind, size in TURNS]
    history.extend(chunks[0][1], chunks[0][0])
    kinds = [chunks[0][0]] * len(chunks[0][1])
    for kind, tokens in chunks[1:]:
        history.extend(tokens, kind)
        kinds += [kind] * len(tokens)
        ids = torch.tensor([history.token_ids])
        ratio = Budget("tokens", 40).compression_ratio(history.length)
        press = make_press(name, ratio)
        if name.startswith("rmm"):
            weights = naive_weights(model, ids, kinds)
            assert history.weights["teacher_forced"] == weights.tolist()
            naive_press = make_press(name, ratio)
            naive_press.correctness = weights.unsqueeze(0)
        else:
            naive_press = make_press(name, ratio)
        cache, kept = history.compress(press), history_kept(history, make_press(name, ratio))
        naive = kept_positions(model, ids, naive_press)
        assert [k.shape[-1] for k in kept] == [40, 40]
        for ours, theirs in zip(kept, naive, strict=True):
            assert torch.equal(ours.sort(-1).values, theirs.sort(-1).values), f"{name} after {len(ids[0])} tokens"

        question = torch.tensor([tokens[:3]])
        answer = decode(model, cache.cache, question, history.length, 5, set())
        naive_cache = prefill(model, ids, naive_press)
        assert answer == decode(model, naive_cache, question, history.length, 5, set())
        assert history.cache.get_seq_length() == history.length, "answering decodes from a copy"


def test_first_turn_rmm_keeps_what_h2o_keeps():
    """With no earlier answers every row weighs 1: the first turn is out of RMM's regime."""
    model = tiny_model("llama", "sdpa")
    history = History(model, frozenset({"answer"}), [make_press("rmm", 0.5), make_press("h2o", 0.5)])
    history.extend(torch.randint(3, 256, (120,), generator=torch.Generator().manual_seed(2)).tolist(), "conversation")
    ratio = Budget("tokens", 50).compression_ratio(history.length)
    rmm = history_kept(history, make_press("rmm", ratio))
    h2o = history_kept(history, make_press("h2o", ratio))
    assert all(torch.equal(a.sort(-1).values, b.sort(-1).values) for a, b in zip(rmm, h2o, strict=True))


def test_every_row_teacher_forced_including_rows_at_chunk_boundaries():
    """``--rmm-weights all``: a chunk's last row learns its next token only from the next chunk; its weight and
    its share of the weighted sums are revised then, matching one full forward over the whole history."""
    model = tiny_model("qwen2", "sdpa")
    everything = frozenset({"conversation", "question", "answer"})
    history = History(model, teacher_forced_kinds=everything, presses=[make_press("rmm", 0.5)])
    generator = torch.Generator().manual_seed(11)
    for kind, size in [("conversation", 70), *TURNS]:
        history.extend(torch.randint(3, 256, (size,), generator=generator).tolist(), kind)
    ids = torch.tensor([history.token_ids])
    with torch.no_grad():
        predicted = model(input_ids=ids).logits.argmax(-1)[0]
    expected = torch.cat([(predicted[:-1] == ids[0, 1:]).float(), torch.ones(1)])
    assert history.weights["teacher_forced"] == expected.tolist()
    assert 0 < expected.mean() < 1
    ratio = Budget("tokens", 40).compression_ratio(history.length)
    naive_press = make_press("rmm", ratio)
    naive_press.correctness = expected.unsqueeze(0)
    kept = history_kept(history, make_press("rmm", ratio))
    for ours, theirs in zip(kept, kept_positions(model, ids, naive_press), strict=True):
        assert torch.equal(ours.sort(-1).values, theirs.sort(-1).values)


def test_confidence_weighs_the_teacher_forced_kinds_beside_teacher_forcing_in_one_history():
    """Answers weighted: the confidence sums weigh each answer row by its top-1 probability in one full forward
    and every other row 1, while the teacher-forced sums of the same history keep their own weights; each press
    keeps what a re-prefill with its weights supplied keeps."""
    model = confident_model("qwen2", "sdpa")
    names = ["rmm(lag=8,correctness='confidence')", "rmm(lag=8)"]
    history = History(model, teacher_forced_kinds=frozenset({"answer"}), presses=[make_press(n, 0.5) for n in names])
    generator = torch.Generator().manual_seed(17)
    kinds: list[str] = []
    for kind, size in [("conversation", 70), *TURNS]:
        history.extend(torch.randint(3, 256, (size,), generator=generator).tolist(), kind)
        kinds += [kind] * size
    ids = torch.tensor([history.token_ids])
    answers = torch.tensor([kind == "answer" for kind in kinds])
    confident = torch.where(answers, confidence_weights(model, ids)[0], 1.0)
    torch.testing.assert_close(torch.tensor(history.weights["confidence"]), confident, rtol=1e-5, atol=1e-6)
    forced = naive_weights(model, ids, kinds)
    assert history.weights["teacher_forced"] == forced.tolist()
    ratio = Budget("tokens", 40).compression_ratio(history.length)
    for name, weights in zip(names, (confident, forced), strict=True):
        naive_press = make_press(name, ratio)
        naive_press.correctness = weights.unsqueeze(0)
        assert same_sets(history_kept(history, make_press(name, ratio)), kept_positions(model, ids, naive_press)), name


def test_a_long_extend_runs_in_bounded_forwards_and_keeps_what_one_forward_keeps(monkeypatch):
    """The layer inputs a forward captures are bounded by ``EXTEND_CHUNK`` tokens; the pieces' weights and sums
    equal one forward's."""
    monkeypatch.setattr(history_module, "EXTEND_CHUNK", 32)
    lengths = []

    def counted(model, ids, cache, start):
        lengths.append(ids.shape[1])
        return forward_capturing(model, ids, cache, start)

    monkeypatch.setattr(history_module, "forward_capturing", counted)
    model = tiny_model("llama", "eager")
    presses = [make_press("rmm", 0.5), make_press("h2o", 0.5)]
    history = History(model, teacher_forced_kinds=frozenset({"context"}), presses=presses)
    history.extend(torch.randint(3, 256, (120,), generator=torch.Generator().manual_seed(5)).tolist(), "context")
    assert lengths == [32, 32, 32, 24]
    ids = torch.tensor([history.token_ids])
    with torch.no_grad():
        predicted = model(input_ids=ids).logits.argmax(-1)[0]
    expected = torch.cat([(predicted[:-1] == ids[0, 1:]).float(), torch.ones(1)])
    assert history.weights["teacher_forced"] == expected.tolist()
    ratio = Budget("tokens", 40).compression_ratio(history.length)
    rmm = make_press("rmm", ratio)
    rmm.correctness = expected.unsqueeze(0)
    for name, naive_press in [("rmm", rmm), ("h2o", make_press("h2o", ratio))]:
        kept = history_kept(history, make_press(name, ratio))
        for ours, theirs in zip(kept, kept_positions(model, ids, naive_press), strict=True):
            assert torch.equal(ours.sort(-1).values, theirs.sort(-1).values), name


def test_a_turn_in_one_forward_weighs_each_segment_by_its_kind(monkeypatch):
    """``extend_segments``: a question and its answer in one forward; only the answer's rows are teacher-forced,
    as in one full forward, and the kept sets equal a naive re-prefill's. Each turn's attention rows come from
    its own forward (``fused_rows``): only the first forward's are recomputed."""
    forwards, recomputed = [], []

    def counted(model, ids, cache, start):
        forwards.append(ids.shape[1])
        return forward_capturing(model, ids, cache, start)

    def recomputing(module, hidden_states, *args, **kwargs):
        recomputed.append(hidden_states.shape[1])
        return attention_rows(module, hidden_states, *args, **kwargs)

    monkeypatch.setattr(history_module, "forward_capturing", counted)
    monkeypatch.setattr(history_module, "attention_rows", recomputing)
    generator = torch.Generator().manual_seed(13)
    model = tiny_model("llama", "sdpa")
    history = History(model, teacher_forced_kinds=frozenset({"answer"}), presses=[make_press("rmm", 0.5)])
    segments = [("conversation", 80), *TURNS]
    segments = [(torch.randint(3, 256, (size,), generator=generator).tolist(), kind) for kind, size in segments]
    history.extend(*segments[0])
    for turn in range(1, len(segments), 2):
        history.extend_segments(segments[turn : turn + 2])
    assert forwards == [80, 14, 13, 12]
    assert recomputed == [80] * len(model.model.layers)
    kinds = [kind for ids, kind in segments for _ in ids]
    ids = torch.tensor([history.token_ids])
    weights = naive_weights(model, ids, kinds)
    assert history.weights["teacher_forced"] == weights.tolist()
    assert 0 < weights[torch.tensor([kind == "answer" for kind in kinds])].mean() < 1
    ratio = Budget("tokens", 40).compression_ratio(history.length)
    naive_press = make_press("rmm", ratio)
    naive_press.correctness = weights.unsqueeze(0)
    kept = history_kept(history, make_press("rmm", ratio))
    for ours, theirs in zip(kept, kept_positions(model, ids, naive_press), strict=True):
        assert torch.equal(ours.sort(-1).values, theirs.sort(-1).values)
