"""The section-7 probe: its generator, its solver, its prompt spans and its rankings (tiny models only)."""

from __future__ import annotations

import pytest
import torch
from kvpress import ObservedAttentionPress

from evaluation.cli.main import main
from evaluation.engine.history import History
from evaluation.protocols.probe.facts import FACTS, FLAG, LIVES, probes, solve
from evaluation.protocols.probe.prompt import final_answer, prompt_ids
from evaluation.protocols.probe.protocol import SCORERS, ProbeConfig
from evaluation.protocols.probe.ranking import both_in_top, fact_scores, gold_ranks, recency_scores
from evaluation.protocols.probe.work import answer_weights, probe_rows
from evaluation.runs.models import ModelSettings
from presses import RMMPress
from tests.helpers import byte_tokenizer, tiny_model


def test_probes_are_deterministic_and_every_answer_follows_from_the_facts():
    first, again, other = probes(3, 200), probes(3, 200), probes(4, 200)
    assert first == again and first != other
    for probe in first:
        assert len(probe.facts) == FACTS and len(set(probe.facts)) == FACTS
        assert sum(bool(LIVES.match(f)) for f in probe.facts) == sum(bool(FLAG.match(f)) for f in probe.facts) == 8
        assert solve(probe.facts, probe.question) == (probe.answer, probe.gold)
        assert probe.bridge in probe.facts[probe.gold[0]] and probe.bridge in probe.facts[probe.gold[1]]
    assert len({probe.gold for probe in first}) > 100  # the gold facts sit anywhere in the shuffled order


def test_the_solver_reads_the_text_alone():
    probe = probes(0, 1)[0]
    name = probe.question.split("where ")[1].split(" lives")[0]
    moved = tuple(f.replace(probe.bridge, "Zurich") if f.startswith(name) else f for f in probe.facts)
    with pytest.raises(KeyError):  # the person's home now has no flag
        solve(moved, probe.question)
    with pytest.raises(ValueError, match="neither form"):
        solve((*probe.facts[:-1], "Mia likes tea."), probe.question)


@pytest.mark.parametrize("template", [None, "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}>"])
def test_each_span_holds_its_fact_and_the_prompt_ends_with_the_question(template):
    tokenizer = byte_tokenizer(template)
    probe = probes(1, 1)[0]
    ids, spans = prompt_ids(tokenizer, probe, reasoning=True)
    assert [tokenizer.decode(ids[a:b]) for a, b in spans] == list(probe.facts)
    assert probe.question in tokenizer.decode(ids[spans[-1][1] :])
    assert "So the answer is grey." in tokenizer.decode(ids[: spans[0][0]])
    short, _ = prompt_ids(tokenizer, probe, reasoning=False)
    assert "So the answer" not in tokenizer.decode(short)


def test_ranks_count_ties_against_the_scorer():
    scores = [0.0] * FACTS
    scores[3], scores[7] = 5.0, 4.0
    assert gold_ranks(scores, (3, 7)) == [1, 2] and both_in_top([1, 2], 2)
    scores[9] = 4.0  # a distractor tied with a gold fact
    assert gold_ranks(scores, (7, 3)) == [3, 1] and not both_in_top([3, 1], 2)
    assert gold_ranks(recency_scores([(i * 5, i * 5 + 4) for i in range(FACTS)]), (15, 14)) == [1, 2]
    assert final_answer("Mia lives in Oslo. So the answer is red.") == " red."


def eager_mean_attention(model, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per position: sum over rows t >= k of w(t) a(t -> k), over the rows t >= k, averaged over heads and layers,
    from the eager weights of a plain forward (Eq. 1 with no lag, as KVPress averages H2O's sums)."""
    attentions = model(ids, output_attentions=True).attentions
    length = ids.shape[1]
    rows_after = torch.arange(length, 0, -1).float()
    per_layer = [(a[0] * weights[None, :, None]).sum(1).mean(0) / rows_after for a in attentions]
    return torch.stack(per_layer).mean(0)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_engine_rankings_equal_a_hand_computation_from_eager_attention(arch):
    """Demonstrated utility over the answer's rows and H2O, each through its press's own score on the engine,
    rank the facts as Eq. 1 and accumulated attention computed by hand from the eager weights do."""
    tokenizer = byte_tokenizer()
    sdpa, eager = tiny_model(arch, "sdpa", vocab_size=260), tiny_model(arch, "eager", vocab_size=260)
    probe = probes(2, 1)[0]
    ids, spans = prompt_ids(tokenizer, probe, reasoning=True)
    answer = tokenizer.encode(" Ann lives in Rome. So the answer is red.", add_special_tokens=False)
    weights = answer_weights(len(ids), len(ids) + len(answer), [1.0] * len(answer))
    history = History(sdpa, frozenset(), [RMMPress(correctness=weights), ObservedAttentionPress()])
    history.extend(ids, "prompt")
    history.extend(answer, "answer")
    full = torch.tensor([ids + answer])
    cases = ((RMMPress(correctness=weights), weights), (ObservedAttentionPress(), torch.ones(full.shape[1])))
    with torch.no_grad():
        for press, rows in cases:
            engine = fact_scores(history.scores(press), spans)
            by_hand = eager_mean_attention(eager, full, rows)
            expected = [float(by_hand[a:b].mean()) for a, b in spans]
            assert engine == pytest.approx(expected, rel=1e-4)
    assert weights[: len(ids) - 1].sum() == 0 and weights[len(ids) - 1 :].sum() == len(answer)


def test_a_probe_on_a_tiny_model_gives_every_scorer_its_rows(tmp_path):
    model, tokenizer = tiny_model("llama", "sdpa", vocab_size=260), byte_tokenizer()
    probe = probes(5, 1)[0]
    config = ProbeConfig(model=ModelSettings(), seed=5, probes=1, reasoning=True, output=tmp_path, max_new_tokens=6)
    rows = probe_rows((model, tokenizer), probe, config)
    assert [row["press"] for row in rows] == [name for name in SCORERS for _ in range(2)]
    recency = next(row for row in rows if row["press"] == "recency")
    assert recency["prediction"] == " ".join(str(f) for f in reversed(range(FACTS)))
    assert all(1 <= rank <= FACTS for row in rows for rank in row["gold_ranks"])
    assert rows[0]["answer_tokens"] == 6 and not rows[0]["correct"]


def test_the_probe_dry_run_plans_without_a_model(tmp_path, capsys):
    assert main(["probe", "--probes", "3", "--dry-run", "--output", str(tmp_path / "run")]) == 0
    assert "3 probes" in capsys.readouterr().out and not (tmp_path / "run").exists()
