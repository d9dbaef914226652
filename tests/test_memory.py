"""The bounded-memory probe: its generator, the kept positions read from a cache, and a streamed run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from kvpress import AdaKVPress, KnormPress, StreamingLLMPress

from evaluation.cli.main import main
from evaluation.engine.history import History
from evaluation.engine.retention import answer_spans, kept_positions, retention
from evaluation.protocols.synthetic.memory import memory_episodes, older_than_the_budget
from tests.helpers import saved_chat_model, tiny_model

IDS = torch.randint(3, 256, (1, 80), generator=torch.Generator().manual_seed(2))[0].tolist()


def test_the_generator_is_deterministic_and_every_answer_is_stated_once_before_it_is_asked():
    episodes = memory_episodes(0, 3)
    assert episodes == memory_episodes(0, 3) and episodes != memory_episodes(1, 3)
    for episode in episodes:
        stated = {}
        for session in episode.sessions:
            for turn in session.turns:
                name, code = re.fullmatch(r"(.+): (\d{4})\.", turn.text).groups()
                assert name not in stated
                stated[name] = (code, session.number)
        assert len(stated) == 200  # K = 20 facts, the largest multiple 10
        uses = {q.question for q in episode.questions if q.kind == "use"}
        assert len(uses) == 20  # one fact in ten
        for question in episode.questions:
            name = question.question.removeprefix("What is the code of ").removesuffix("?")
            code, session = stated[name]
            assert question.answer == code and question.evidence[0].startswith(f"D{session}:")
            if question.kind != "use":
                assert (question.question in uses) == (question.kind == "reused")
                assert question.evidence[-1] == f"D{question.pair * 20 // 5}:5"  # asked when the stream reaches it
                session, line = map(int, question.evidence[0][1:].split(":"))
                stated_after = question.pair * 20 - ((session - 1) * 5 + line)
                assert older_than_the_budget(episode, question) == (stated_after >= 20)
        asked = [q.question for q in episode.questions if q.kind != "use"]
        assert len(asked) == len(set(asked)), "no fact is re-queried twice"


def test_kept_positions_are_read_back_from_gathered_keys_and_refused_for_changed_ones():
    keys = torch.randn(1, 2, 12, 8)
    index = torch.tensor([[[0, 3, 7, 11], [1, 2, 5, 6]]])
    kept = keys.gather(2, index[..., None].expand(-1, -1, -1, 8))
    assert torch.equal(kept_positions(keys, kept), index)
    assert torch.equal(kept_positions(keys.bfloat16(), kept.bfloat16()), index)
    assert kept_positions(keys, kept * 1.0001) is None


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_retention_is_the_share_of_slots_whose_kept_positions_hold_a_copy(arch):
    model = tiny_model(arch, "sdpa")
    knorm, streaming, ada = KnormPress(0.5), StreamingLLMPress(0.5, n_sink=4), AdaKVPress(KnormPress(0.5))
    history = History(model, frozenset({"context"}), [knorm, streaming, ada])
    history.extend(IDS, "context")
    spans = [list(range(10, 13)), list(range(70, 73))]
    # StreamingLLM keeps the 4 sink positions and the newest 36 in every slot
    assert retention(history.cache, history.compress(streaming), [spans[0]]) == 0.0
    assert retention(history.cache, history.compress(streaming), spans) == 1.0
    # Knorm keeps, per layer and KV head, the 40 keys of smallest norm: KVPress's own rule, computed here
    held = []
    for layer in history.cache.layers:
        kept = (-layer.keys.norm(dim=-1)).topk(40, dim=-1).indices
        member = torch.zeros(layer.keys.shape[:3], dtype=torch.bool).scatter(-1, kept, True)
        held.append(torch.stack([member[..., s].all(-1) for s in spans], -1).any(-1).float().mean().item())
    assert retention(history.cache, history.compress(knorm), spans) == pytest.approx(sum(held) / len(held))
    compressed = history.compress(ada)  # AdaKV holds every key and masks the evicted ones
    assert retention(history.cache, compressed, spans) < 1.0
    assert retention(history.cache, history.compress(None), spans) == 1.0
    assert retention(history.cache, history.compress(knorm), []) is None
    assert answer_spans([5, 1, 2, 9, 1, 2], [1, 2]) == [[1, 2], [4, 5]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return saved_chat_model(tmp_path_factory.mktemp("tiny-llama"), "llama", context=8192)


def test_a_memory_stream_tells_its_uses_scores_its_re_queries_and_records_what_each_cache_holds(model_dir, tmp_path):
    output = tmp_path / "memory"
    argv = ["memory", "--model", str(model_dir), "--output", str(output), "--presses", "full", "h2o", "rmm(lag=8)"]
    settings = ["--episodes", "1", "--budget-facts", "5", "--multiples", "1", "2", "--queries", "1"]
    assert main([*argv, *settings, "--budgets", "200", "--max-new-tokens", "3"]) == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert {row["kind"] for row in rows} == {"reused", "never reused"}, "a use is told, never asked"
    assert len(rows) == 3 * len({(row["question_index"]) for row in rows})
    for row in rows:
        assert 0.0 <= row["retention"] <= 1.0
        assert (
            row["retention"] == 1.0 if row["press"] == "full" else row["kept_tokens"] == min(200, row["history_tokens"])
        )
    assert "| answer held (%), overall | 200 tokens |" in (output / "scorecard.md").read_text()
    assert main([*argv, *settings, "--budgets", "200", "--max-new-tokens", "3"]) == 0
    assert (output / "predictions.jsonl").read_text().count("\n") == len(rows), "a finished run adds nothing"
