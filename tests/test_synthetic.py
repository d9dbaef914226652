"""The synthetic families: deterministic generators, answers recoverable from the text the model reads (by a
solver that parses that text, not the generator's records), and runs through the streaming protocol."""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from dataclasses import asdict
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from evaluation.cli.main import main
from evaluation.metrics.synthetic import string_match
from evaluation.protocols.streaming.episodes import Question, Session
from evaluation.protocols.streaming.placements import asked_after_session
from evaluation.protocols.synthetic.memory import memory_episodes
from evaluation.protocols.synthetic.multiquery import multiquery_episodes
from evaluation.protocols.synthetic.reuse import PAUSE, reuse_episodes
from evaluation.protocols.synthetic.task import (
    MULTIQUERY,
    REUSE,
    first_use_distance,
    reuse_conditions,
    sentence_answer,
    spec_lag,
)
from evaluation.runs.models import BYTE_CHAT_TEMPLATE, SMOLLM2_ALIAS, local_model
from tests.helpers import byte_tokenizer, saved_chat_model


def test_the_generators_are_deterministic_in_their_seed():
    assert [asdict(c) for c in reuse_episodes(3, 2)] == [asdict(c) for c in reuse_episodes(3, 2)]
    assert [asdict(c) for c in reuse_episodes(3, 2)] != [asdict(c) for c in reuse_episodes(4, 2)]
    documents = multiquery_episodes(5, [1024, 2048], 2)
    assert [asdict(c) for c in documents] == [asdict(c) for c in multiquery_episodes(5, [1024, 2048], 2)]
    assert [asdict(c) for c in documents] != [asdict(c) for c in multiquery_episodes(6, [1024, 2048], 2)]


def test_the_memory_and_multiquery_episodes_are_the_ones_the_code_before_the_restated_control_generated():
    """The reuse family's generator changed its control (a plain restatement); the families sharing task.py keep
    their episodes byte for byte: the fingerprints ``generated`` records, as the code before (a214d6a) wrote them."""
    episodes = {
        "memory": ({"seed": 0, "episodes": 2}, memory_episodes),
        "multiquery": ({"seed": 0, "lengths": [1024, 2048], "per_length": 2}, multiquery_episodes),
    }
    fingerprints = {
        name: hashlib.sha256(json.dumps([asdict(c) for c in make(**kw)], sort_keys=True).encode()).hexdigest()
        for name, (kw, make) in episodes.items()
    }
    assert fingerprints == {
        "memory": "0565f17a5b0810e729a4ae071609f8cf1c76b176ba3618249ba007b2ded5e06d",
        "multiquery": "022f5274efbf0d81023c6da87119e0e3ba8e3a748b3b61cc880252047f0356a3",
    }


def solve_codes(text: str) -> dict[str, str]:
    """Every lock code the conversation states, by "<name>'s <thing>"; a lock with two codes would be ambiguous."""
    found = set(re.findall(r"the code of (\w+'s [\w ]+?) is (\d+)\.", text))
    assert len({lock for lock, _ in found}) == len(found), "a lock is given two codes"
    return dict(found)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_reuse_answer_is_recoverable_from_the_conversation_when_it_is_asked(seed):
    for conversation in reuse_episodes(seed, 2, sessions=6, lag=2):
        stated: dict[str, int] = {}  # lock -> the session first stating it
        for session in conversation.sessions:
            for lock in solve_codes(REUSE.render_session(session)):
                stated.setdefault(lock, session.number)
        asked: dict[str, int] = {}  # lock -> the session it was first asked after
        ages: dict[int, dict[str, int]] = {}  # session -> kind -> the session its lock was stated in
        for question in sorted(conversation.questions, key=lambda q: (asked_after_session(conversation, q), q.index)):
            session = asked_after_session(conversation, question)
            lock = re.fullmatch(r"What is the code of (.+)\?", question.question).group(1)
            seen = REUSE.text(conversation, [s for s in conversation.sessions if s.number <= session])
            assert solve_codes(seen)[lock] == question.answer
            if question.kind == "reuse":
                assert asked[lock] == session - 2, "asked again exactly lag sessions after its first ask"
            else:
                assert lock not in asked, "a first ask, or a control never asked before"
                asked[lock] = session
            ages.setdefault(session, {})[question.kind] = stated[lock]
        for session, kinds in ages.items():
            assert set(kinds) == ({"first"} if session <= 2 else {"first", "reuse", "fresh"})
            assert kinds.get("reuse") == kinds.get("fresh"), "the control is as old as the reused code"
            text = REUSE.render_session(conversation.sessions[session - 1])
            restated = session > 1
            assert len(re.findall(r"the code of", text)) == 2 + restated, "2 codes, and the last session's control"


def test_the_control_is_restated_as_stated_right_after_the_used_codes_answer():
    """A control's second copy is a plain restatement: the next session opens with its statement again, word for
    word and by the same speaker, and no question about it comes before its re-ask. The used code's first ask is
    the last question asked after its session, so the restatement directly follows that answer in the stream; the
    control's statement directly follows the used code's."""
    for conversation in reuse_episodes(0, 3, sessions=6, facts=3, lag=2):
        questions = sorted(conversation.questions, key=lambda q: (asked_after_session(conversation, q), q.index))
        for question in (q for q in questions if q.kind == "fresh"):
            (stated, at), (again, opening) = (turn_at(conversation, item) for item in question.evidence[:2])
            assert again.number == stated.number + 1 and opening == 0
            assert again.turns[0].text == stated.turns[at].text and again.turns[0].speaker == stated.turns[at].speaker
            assert stated.turns[at].text.endswith(sentence_answer(question)[3:]), "the control's statement"
            assert [q for q in questions if q.question == question.question] == [question], "never asked before"
            reused = next(q for q in questions if q.pair == question.pair and q.kind == "reuse")
            first = next(q for q in questions if q.kind == "first" and q.question == reused.question)
            after = [q for q in questions if asked_after_session(conversation, q) == stated.number]
            assert after[-1] == first, "the used code's answer is the last thing before the restatement"
            used, used_at = turn_at(conversation, first.evidence[0])
            assert used.number == stated.number and at == used_at + 2
            assert (stated.turns[at - 1].speaker, stated.turns[at - 1].text) == ("Alex", PAUSE), "the pause between"


def turn_at(conversation, dia_id: str) -> tuple[Session, int]:
    """The session holding turn ``dia_id`` ("D3:2") and the turn's index in it."""
    number, turn = (int(part) for part in dia_id.removeprefix("D").split(":"))
    return conversation.sessions[number - 1], turn - 1


def test_the_order_of_asking_alternates_so_each_side_of_a_pair_comes_first_equally_often():
    firsts = []
    for seed in range(3):
        for conversation in reuse_episodes(seed, 4):
            for pair in sorted({q.pair for q in conversation.questions if q.pair}):
                asked = sorted((q for q in conversation.questions if q.pair == pair), key=lambda q: q.index)
                assert [q.order for q in asked] == [1, 2] and {q.kind for q in asked} == {"reuse", "fresh"}
                firsts.append(asked[0].kind)
    assert len(firsts) == 60 and firsts.count("reuse") == firsts.count("fresh")


def chat_text(conversation, number: int, tokenizer) -> str:
    """The conversation through session ``number + 1`` as the tokenizer's chat template renders it whole: the header
    as the system message, each session a user message, each question asked after it a user message and its gold
    answer the assistant's; without a template, the plain framing (a session or a question after a newline, an
    answer after a space and before a newline)."""
    messages = [{"role": "system", "content": REUSE.header(conversation)}]
    for session in conversation.sessions[: number + 1]:
        messages.append({"role": "user", "content": REUSE.render_session(session)})
        for asked in (q for q in conversation.questions if asked_after_session(conversation, q) == session.number):
            messages += [{"role": "user", "content": asked.question}]
            messages += [{"role": "assistant", "content": sentence_answer(asked)}]
    if tokenizer.chat_template is not None:
        return tokenizer.apply_chat_template(messages, tokenize=False)
    plain = {"system": "{}", "user": "\n{}", "assistant": " {}\n"}
    return "".join(plain[m["role"]].format(m["content"]) for m in messages)


def code_span(conversation, question, text: str) -> tuple[int, int]:
    """Where, in ``text``, the code's statement ends (its last character) and its first use's copy of the code
    begins: the first ask's answer sentence for a used code, the statement's second occurrence for a control."""
    number = int(question.evidence[0][1:].split(":")[0])
    statement = f'"Please note this down for me, Alex: the code of {question.question[20:-1]} is {question.answer}."'
    opening = text.index(REUSE.render_session(conversation.sessions[number - 1]))
    last = text.index(statement, opening) + len(statement) - 2
    if question.kind == "fresh":
        return last, text.index(statement, last) + statement.rindex(question.answer)
    answer = sentence_answer(question)
    return last, text.index(answer, last) + answer.rindex(question.answer)


def test_the_first_use_distance_counts_bytes_in_the_plain_and_the_chat_framing():
    """With a byte tokenizer a token is a byte, and a special token of the chat template ("<s>", "</s>") one token:
    the positions from the statement's last byte to the first byte of the code's second copy."""
    for template in (None, BYTE_CHAT_TEMPLATE):
        tokenizer = byte_tokenizer(template)
        conversation = reuse_episodes(1, 1)[0]
        for question in (q for q in conversation.questions if q.kind in ("reuse", "fresh")):
            text = chat_text(conversation, int(question.evidence[0][1:].split(":")[0]), tokenizer)
            last, use = code_span(conversation, question, text)
            expected = len(re.sub("</?s>", "#", text[last:use]))
            assert first_use_distance(conversation, question, tokenizer) == expected, (template, question.kind)


def smollm2_tokenizer():
    folder = local_model(SMOLLM2_ALIAS)
    if folder is None:
        pytest.skip("the offline SmolLM2 is not converted yet (any run with --model smollm2-135m converts it)")
    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize(
    ("seed", "episodes", "settings"),
    [(0, 10, {}), (1, 10, {}), (2, 10, {}), (0, 8, {"sessions": 8, "facts": 4, "lag": 3})],
)
def test_a_used_code_and_its_control_are_first_used_at_matched_distances(seed, episodes, settings):
    """In the stream a run builds with SmolLM2 (the runs' model, its chat template; ``make eval-reuse``'s episodes
    first), counted independently (the whole conversation rendered by the template and encoded at once): each
    distance is as ``first_use_distance`` records it, a pair's two differ by at most 2 positions, and their medians
    by at most 1 (before the pause: the control 16 tokens further in every pair)."""
    tokenizer = smollm2_tokenizer()
    distances: dict[str, list[int]] = {"reuse": [], "fresh": []}
    for conversation in reuse_episodes(seed, episodes, **settings):
        pairs: dict[int, dict[str, int]] = {}
        for question in (q for q in conversation.questions if q.kind in distances):
            text = chat_text(conversation, int(question.evidence[0][1:].split(":")[0]), tokenizer)
            spans = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            last, use = (
                next(i for i, (_, end) in enumerate(spans) if end > c) for c in code_span(conversation, question, text)
            )
            assert first_use_distance(conversation, question, tokenizer) == use - last
            pairs.setdefault(question.pair, {})[question.kind] = use - last
        for pair in pairs.values():
            assert abs(pair["fresh"] - pair["reuse"]) <= 2, pair
            for kind, distance in pair.items():
                distances[kind].append(distance)
    assert abs(statistics.median(distances["fresh"]) - statistics.median(distances["reuse"])) <= 1


def test_finite_lags_split_the_reused_codes_by_whether_their_window_reaches_the_first_use():
    assert spec_lag("rmm(lag=16)") == 16 and spec_lag("adakv(rmm(lag=4))") == 4
    assert spec_lag("rmm") is None and spec_lag("h2o") is None and spec_lag("full") is None
    row = {"kind": "reuse", "order": 2, "first_use_distance": 40}
    assert reuse_conditions(row | {"press": "h2o"}) == ["overall", "asked again", "asked again, asked second"]
    assert reuse_conditions(row | {"press": "rmm(lag=64)"})[-1] == "asked again, the lag's window reaches the first use"
    assert reuse_conditions(row | {"press": "rmm(lag=16)"})[-1] == "asked again, the lag's window misses the first use"
    assert reuse_conditions({"kind": "first", "order": 0, "press": "rmm(lag=16)"}) == ["overall", "first ask"]


def solve_document(text: str, question: str) -> str:
    """The answer as a reader of the document finds it: a record, a needle, or a chain of assignments."""
    if match := re.match(r"What is the pass code of the (\w+ \w+)\?", question):
        (answer,) = re.findall(rf"The pass code of the {match.group(1)} is (\d+)\.", text)
        return answer
    if match := re.match(r"What is the special magic number for (\w+)\?", question):
        (answer,) = re.findall(rf"The special magic number for {match.group(1)} is (\d+)\.", text)
        return answer
    name = re.fullmatch(r"What is the value of VAR (\w+)\?", question).group(1)
    assignments = re.findall(r"VAR (\w+) = ", text)
    assert len(set(assignments)) == len(assignments), "a variable is assigned twice"
    values = dict(re.findall(r"VAR (\w+) = (\d+)\.", text))
    links = dict(re.findall(r"VAR (\w+) = VAR (\w+)\.", text))
    while name in links:
        assert text.index(f"VAR {links[name]} =") < text.index(f"VAR {name} ="), "a variable is read before it is set"
        name = links[name]
    return values[name]


@pytest.mark.parametrize("seed", [0, 1])
def test_every_multiquery_answer_is_recoverable_from_the_document(seed):
    documents = multiquery_episodes(seed, [1024, 4096], 2)
    for document in documents:
        text = MULTIQUERY.text(document, document.sessions)
        assert {q.kind for q in document.questions} == {"kv", "vt", "needle"}
        for question in document.questions:
            assert solve_document(text, question.question) == question.answer


def test_string_match_counts_the_answer_only_as_a_whole_number_or_word():
    assert string_match("The code is 4821.", "4821") == 1.0
    assert string_match("4821", "4821") == 1.0
    assert string_match("48213", "4821") == 0.0
    assert string_match("14821", "4821") == 0.0
    assert string_match("It is AMBER", "amber") == 1.0
    assert string_match("", "4821") == 0.0


def test_the_history_records_each_gold_answer_as_a_sentence():
    question = Question(0, "What is the code of Mia's locker?", "4821", [], 0, None, "first")
    assert sentence_answer(question) == "The code of Mia's locker is 4821."
    question = Question(0, "What is the value of VAR AB?", "41234", [], 0, None, "vt")
    assert sentence_answer(question) == "The value of VAR AB is 41234."


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return saved_chat_model(tmp_path_factory.mktemp("tiny-llama"), "llama", context=8192)


def reuse_run(model_dir: Path, output: Path, *extra: str) -> int:
    presses = ["full", "h2o", "rmm", "rmm(lag=4)", "streaming_llm"]
    argv = ["reuse", "--model", str(model_dir), "--output", str(output), "--presses", *presses]
    settings = ["--episodes", "1", "--sessions", "2", "--facts", "2", "--lag", "1", "--budgets", "300"]
    return main([*argv, *settings, "--max-new-tokens", "3", *extra])


def test_reuse_streams_resumes_and_refuses_other_episodes(model_dir, tmp_path, capsys):
    output = tmp_path / "reuse"
    assert reuse_run(model_dir, output) == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == (2 + 2) * 5  # a first ask per session, a reuse and a control from session 2 on
    assert {row["kind"] for row in rows} == {"first", "reuse", "fresh"}
    assert all(row["family"] == "reuse" and row["evidence_visible"] for row in rows)
    for row in rows:
        assert row["kept_tokens"] == (row["history_tokens"] if row["press"] == "full" else 300)
    scorecard = (output / "scorecard.md").read_text()
    for condition in ("overall", "first ask", "asked again", "never asked (control)"):
        assert f"| {condition} | 300 tokens |" in scorecard
    assert json.loads((output / "run.json").read_text())["config"]["task"] == "reuse"
    assert reuse_run(model_dir, output) == 0
    assert (output / "predictions.jsonl").read_text().count("\n") == len(rows), "a finished run adds nothing"
    assert reuse_run(model_dir, output, "--seed", "1") == 2
    assert "holds a run with other settings" in capsys.readouterr().err
    assert main(["scorecard", str(output), "--output", str(tmp_path / "combined")]) == 0
    combined = (tmp_path / "combined" / "scorecard.md").read_text()
    assert "| Reuse asked again | 300 tokens |" in combined
    assert "## Reuse: asked again - never asked (control), paired" in combined
    header = "| budget | press | asked again | never asked (control) | difference | n | MDE | p | verdict | Holm |"
    assert header in combined
    note = "not a use against none"
    assert note in scorecard and note in combined, "the contrast says what it measures"
    assert (output / "contrasts.csv").read_text() == (tmp_path / "combined" / "contrasts.csv").read_text().replace(
        "Reuse: ", ""
    ), "the combined scorecard carries the run's contrasts"


def test_a_document_longer_than_the_history_limit_says_how_to_read_past_it(model_dir, tmp_path, capsys):
    argv = ["multiquery", "--model", str(model_dir), "--output", str(tmp_path / "mq"), "--presses", "full", "h2o"]
    assert main([*argv, "--lengths", "2048", "--episodes", "1", "--max-history-tokens", "4000"]) == 2
    assert "pass a larger --max-history-tokens" in capsys.readouterr().err
