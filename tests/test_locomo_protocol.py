"""LoCoMo: rendering, the official scoring rules, the streaming runner end to end, resume, and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.cli.main import main
from evaluation.metrics.locomo import multi_hop_f1, normalize_answer, score, stemmed_f1
from evaluation.protocols.locomo.data import parse_conversation
from evaluation.protocols.locomo.render import choice_options, question_prompt, render_conversation, resolve_choice
from evaluation.protocols.streaming.episodes import Question
from evaluation.protocols.streaming.work import evictions
from tests.helpers import saved_chat_model

CONVERSATION = {
    "sample_id": "conv-test",
    "conversation": {
        "speaker_a": "Ana",
        "speaker_b": "Ben",
        "session_1_date_time": "1:00 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a cat named Miso."},
            {"speaker": "Ben", "dia_id": "D1:2", "text": "Lovely!", "blip_caption": "a photo of a dog"},
        ],
        "session_2_date_time": "9:30 am on 20 May, 2023",
        "session_2": [
            {"speaker": "Ben", "dia_id": "D2:1", "text": "I ran a marathon in Lisbon."},
            {"speaker": "Ana", "dia_id": "D2:2", "text": "Congratulations, that is far."},
        ],
        "session_3_date_time": "never held",
    },
    "qa": [
        {"question": "What is the cat called?", "answer": "Miso", "evidence": ["D1:1"], "category": 4},
        {"question": "When did Ben run?", "answer": "May 2023", "evidence": ["D2:1"], "category": 2},
        {"question": "What did Ben adopt?", "evidence": ["D1:2"], "category": 5, "adversarial_answer": "a cat"},
        {"question": "Which pets and places?", "answer": 2, "evidence": ["D1:1", "D2:1"], "category": 1},
    ],
}


def test_evidence_sessions_read_the_variants_in_locomo10():
    def sessions(evidence: list[str]) -> set[int]:
        return Question(0, "?", "a", evidence, 1, None).evidence_sessions

    assert sessions(["D1:14", "D:11:26", "D20:21"]) == {1, 11, 20}  # conv-43, question 18
    assert sessions(["D9:1 D4:4 D4:6"]) == {4, 9}  # conv-49, question 31
    assert sessions(["D8:6; D9:17"]) == {8, 9}  # conv-26, question 37
    assert sessions(["D1:18", "D", "D1:20"]) == {1}  # conv-42, question 88


def test_rendering_of_a_two_session_conversation():
    conversation = parse_conversation(CONVERSATION)
    assert [s.number for s in conversation.sessions] == [1, 2], "a date without a session is no session"
    text = render_conversation(conversation, conversation.sessions)
    assert text.startswith("Below is a conversation between Ana and Ben.")
    assert (
        "DATE: 1:00 pm on 8 May, 2023\nCONVERSATION:\n"
        'Ana said, "I adopted a cat named Miso."\n'
        'Ben said, "Lovely!" and shared a photo of a dog.\n\n'
        "DATE: 9:30 am on 20 May, 2023\nCONVERSATION:\n"
        'Ben said, "I ran a marathon in Lisbon."\n'
    ) in text
    temporal = question_prompt(conversation, conversation.questions[1])
    assert temporal.endswith(
        "Question: When did Ben run? Use the DATE of the conversation to answer with an approximate date. Short answer:"
    )
    adversarial = question_prompt(conversation, conversation.questions[2])
    first, second = choice_options(conversation, conversation.questions[2])
    assert {first, second} == {"a cat", "Not mentioned in the conversation"}
    assert f"Select the correct answer: (a) {first} (b) {second}." in adversarial
    assert choice_options(conversation, conversation.questions[2]) == [first, second], "seeded order"
    assert resolve_choice("(b)", [first, second]) == second and resolve_choice("a) yes", [first, second]) == first
    assert resolve_choice("Not mentioned", [first, second]) == "Not mentioned"


def test_scoring_rules():
    assert normalize_answer("The cat, and a Dog!") == "cat dog"
    assert stemmed_f1("running dogs", "the dog runs") == 1.0, "Porter stemming"
    assert score(4, "Paris", "Paris, France") == pytest.approx(2 / 3)
    assert multi_hop_f1("Paris, Rome", "Rome, Paris, Oslo") == pytest.approx(2 / 3), "comma parts, best match each"
    assert score(1, "Paris, Rome", "Rome, Paris, Oslo") == pytest.approx(2 / 3)
    assert score(3, "likely psychology", "psychology; counseling") == pytest.approx(2 / 3), "cut at the first ';'"
    assert score(2, "7 May 2023", "7 May 2023") == 1.0
    assert score(4, "2", 2) == 1.0, "integer answers are compared as strings"
    assert score(5, "Not mentioned in the conversation", None) == 1.0
    assert score(5, "No information available.", "x") == 1.0
    assert score(5, "a cat", None) == 0.0


def test_rescoring_command(tmp_path, capsys):
    rows = [
        {"category": 4, "prediction": "Paris", "answer": "Paris"},
        {"category": 5, "prediction": "a cat", "answer": None},
        {"category": 4, "prediction": "Rome", "answer": "Paris"},
        {"category": 2, "prediction": "2023", "answer": 2023},
    ]
    path = tmp_path / "locomo.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["score", "locomo", str(path), "--per-row"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "2": 1.0,
        "4": 0.5,
        "5": 0.0,
        "overall": 0.5,
        "rows": [1.0, 0.0, 0.0, 1.0],
    }


def test_rescoring_a_committed_run_scores_what_the_run_scored(capsys):
    """``score locomo`` on the committed run: every row's score equals the run's own, the adversarial letter
    answers (scored as their option's text, ``scored_prediction``) included."""
    path = Path(__file__).resolve().parents[1] / "results" / "locomo" / "smollm2-135m" / "predictions.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert any(row["prediction"] != row["scored_prediction"] for row in rows), "rows where the two differ"
    assert main(["score", "locomo", str(path), "--per-row"]) == 0
    rescored = json.loads(capsys.readouterr().out)["rows"]
    assert rescored == pytest.approx([row["score"] for row in rows], abs=1e-12)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return saved_chat_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", context=4096)


@pytest.fixture
def data_file(tmp_path) -> Path:
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps([CONVERSATION]))
    return path


def locomo(model_dir: Path, data: Path, output: Path, *extra: str) -> int:
    presses = ["full", "h2o", "rmm", "tova", "snapkv"]
    argv = [
        "locomo",
        "--model",
        str(model_dir),
        "--data",
        str(data),
        "--output",
        str(output),
        "--presses",
        *presses,
        "--budgets",
        "200",
        "--max-new-tokens",
        "4",
    ]
    return main([*argv, *extra])


def test_the_eviction_count_names_its_questions_at_each_budget():
    def row(index: int, label: str, history: int, kept: int, press: str = "h2o") -> dict:
        keys = {"conversation": "c", "question_index": index, "press": press, "budget_label": label}
        return keys | {"history_tokens": history, "kept_tokens": kept}

    rows = [row(0, "512 tokens", 900, 512), row(1, "512 tokens", 700, 512), row(0, "1800 tokens", 900, 900)]
    rows += [row(1, "1800 tokens", 2000, 1800), row(0, "512 tokens", 900, 900, "full")]
    assert evictions(rows) == (
        "the history exceeded the budget (the presses evicted) for 2 of 2 questions at 512 tokens, "
        "1 of 2 questions at 1800 tokens"
    )
    assert evictions(rows[-1:]) == ""


def test_stream_runs_resumes_and_writes_the_scorecard(model_dir, data_file, tmp_path):
    output = tmp_path / "run"
    assert locomo(model_dir, data_file, output) == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 5
    assert [r["turn"] for r in rows if r["press"] == "rmm"] == [0, 1, 2, 3]
    for row in rows:
        assert row["kept_tokens"] == (row["history_tokens"] if row["press"] == "full" else 200)
    histories = [r["history_tokens"] for r in rows if r["press"] == "full"]
    assert histories == sorted(histories) and len(set(histories)) == 4, "the history grows every turn"
    first_turn = {r["press"]: r["prediction"] for r in rows if r["turn"] == 0}
    assert first_turn["rmm"] == first_turn["h2o"], "out of regime on the first turn: RMM is H2O"
    scorecard = (output / "scorecard.md").read_text()
    conditions = ("overall (1-4)", "first turn", "later turns", "temporal (2)", "adversarial (5)")
    for condition in conditions:
        assert f"| {condition} | 200 tokens |" in scorecard
    # every evidence is visible, and the first turn is the one single-hop question: the same rows, reported once
    assert "| evidence visible |" not in scorecard and "| single-hop (4) |" not in scorecard
    assert (output / "scorecard.png").stat().st_size > 0

    lines = (output / "predictions.jsonl").read_text().splitlines(keepends=True)
    (output / "predictions.jsonl").write_text("".join(lines[:-7]) + lines[-7][:25])
    assert locomo(model_dir, data_file, output) == 0
    resumed = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in resumed] == [r["prediction"] for r in rows]
    assert json.loads((output / "run.json").read_text())["sessions"][-1]["units_run"] == 1


def test_dropped_sessions_make_questions_unanswerable(model_dir, data_file, tmp_path):
    output = tmp_path / "short"
    assert locomo(model_dir, data_file, output, "--max-history-tokens", "300", "--presses", "full") == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert [r["evidence_visible"] for r in rows] == [False, True, False, False]
    assert "evidence inside the history for 1 of 4 questions (25%)" in (output / "scorecard.md").read_text()


def test_the_dry_run_counts_the_evidence_the_file_placement_keeps(model_dir, data_file, tmp_path, capsys):
    # 300 tokens hold session 2 only: question 1 (D2:1) is visible, 0 and 2 (D1) and 3 (D1 and D2) are not
    extra = ("--max-history-tokens", "300", "--presses", "full", "--dry-run")
    assert locomo(model_dir, data_file, tmp_path / "plan", *extra) == 0
    assert "evidence inside the history for 1 of 4 questions (25%)" in capsys.readouterr().out
    assert not (tmp_path / "plan").exists(), "a dry run writes nothing"
    assert locomo(model_dir, data_file, tmp_path / "plan", "--max-new-tokens", "4000", "--dry-run") == 2
    assert "questions and answers take" in capsys.readouterr().err


def test_evidence_placement_asks_each_question_after_its_last_evidence_session(model_dir, data_file, tmp_path):
    output = tmp_path / "evidence"
    assert locomo(model_dir, data_file, output, "--placement", "evidence", "--presses", "full", "rmm") == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    full = [r for r in rows if r["press"] == "full"]
    # session 1 holds the evidence of questions 0 and 2, session 2 the last evidence of questions 1 and 3
    assert [r["question_index"] for r in full] == [0, 2, 1, 3]
    assert [r["turn"] for r in full] == [0, 1, 2, 3]
    assert all(r["evidence_visible"] and r["placement"] == "evidence" for r in rows)
    tokens = [r["history_tokens"] for r in full]
    assert tokens[0] < tokens[1] < tokens[2] < tokens[3], "sessions and turns stream in"
    assert min(tokens) > 200
    larger = tmp_path / "larger"
    budgets = ("--budgets", "200", str(max(tokens)))
    assert locomo(model_dir, data_file, larger, "--placement", "evidence", "--presses", "full", "h2o", *budgets) == 0
    evicted = f"evicted) for 4 of 4 questions at 200 tokens, 0 of 4 questions at {max(tokens)} tokens"
    assert evicted in (larger / "scorecard.md").read_text(), "a budget as long as the history evicts nothing"
    filed = tmp_path / "file"
    assert locomo(model_dir, data_file, filed, "--presses", "full") == 0
    first = json.loads((filed / "predictions.jsonl").read_text().splitlines()[0])
    assert tokens[0] < first["history_tokens"], "the first question comes before the second session"


def test_max_turns_takes_the_first_questions_in_the_order_the_placement_asks_them(model_dir, data_file, tmp_path):
    asked = {}
    for placement in ("file", "evidence"):
        output = tmp_path / placement
        extra = ("--placement", placement, "--presses", "full", "--max-turns", "2")
        assert locomo(model_dir, data_file, output, *extra) == 0
        rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
        asked[placement] = [r["question_index"] for r in rows]
    assert asked == {"file": [0, 1], "evidence": [0, 2]}, "questions 0 and 2 are the two asked after session 1"


def test_evidence_placement_restarts_from_the_newest_sessions_when_the_context_is_full(model_dir, data_file, tmp_path):
    output = tmp_path / "evidence"
    extra = ("--placement", "evidence", "--presses", "full", "--max-history-tokens", "330")
    assert locomo(model_dir, data_file, output, *extra) == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert [r["evidence_visible"] for r in rows] == [True, True, True, False], "question 3's session 1 is gone"
    assert rows[2]["history_tokens"] < rows[1]["history_tokens"], "the history restarted at session 2"


def test_model_history_mode_streams_each_cell_separately(model_dir, data_file, tmp_path):
    output = tmp_path / "model"
    assert locomo(model_dir, data_file, output, "--history", "model", "--presses", "tova", "--max-turns", "2") == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["history_mode"] == "model" for r in rows)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budgets", "0"], "argument --budgets: 0 is below 1"),
        (["--budgets", "100000"], "budget 100000 is not smaller than the history of conv-test"),
        (["--presses", "nosuch"], "press spec 'nosuch': unknown press 'nosuch'; known: AdaKVPress"),
        (["--conversations", "conv-99"], "unknown conversation(s) ['conv-99']; the data holds conv-test"),
    ],
)
def test_bad_input_gets_a_clear_error(model_dir, data_file, tmp_path, capsys, extra, message):
    assert locomo(model_dir, data_file, tmp_path / "out", *extra) == 2
    assert message in capsys.readouterr().err


def test_missing_or_malformed_data_file(model_dir, tmp_path, capsys):
    assert locomo(model_dir, tmp_path / "absent.json", tmp_path / "out") == 2
    assert f"LoCoMo data file {tmp_path / 'absent.json'} not found: pass --data" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text('[{"sample_id": "x",')
    assert locomo(model_dir, broken, tmp_path / "out") == 2
    error = capsys.readouterr().err
    assert f"{broken}: not a readable JSON file" in error
    incomplete = tmp_path / "incomplete.json"
    incomplete.write_text(json.dumps([{"sample_id": "x", "qa": []}]))
    assert locomo(model_dir, incomplete, tmp_path / "out") == 2
    assert f"{incomplete}: conversation 0: x: conversation must be an object, not null" in capsys.readouterr().err


def test_a_run_recorded_before_streamed_tasks_existed_resumes(model_dir, data_file, tmp_path):
    output = tmp_path / "older"
    assert locomo(model_dir, data_file, output, "--max-turns", "1") == 0
    record = json.loads((output / "run.json").read_text())
    del record["config"]["task"]
    (output / "run.json").write_text(json.dumps(record))
    assert locomo(model_dir, data_file, output, "--max-turns", "2") == 2, "max_turns defines the results"
    assert locomo(model_dir, data_file, output, "--max-turns", "1") == 0


def test_any_kvpress_press_streams_and_one_on_its_own_prefill_re_prefills_each_question(model_dir, data_file, tmp_path):
    """Presses the history serves (KNorm, AdaKV's masking, PyramidKV) and one that may run forward passes of its own
    (a re-prefill of the whole history before each of its questions): the latter answers as KNorm, whose hook it
    runs, and run.json records how each press went."""
    output = tmp_path / "any"
    own = "tests.helpers:OwnPrefillKnorm"
    decoding = "decoding(knorm,compression_interval=2)"
    presses = ("--presses", "knorm", own, "adakv(snapkv(window_size=4))", "pyramidkv(window_size=4)", decoding)
    presses += ("--allow-import",)
    assert locomo(model_dir, data_file, output, *presses) == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert {r["press"]: r["path"] for r in rows} == {
        "knorm": "shared",
        own: "own-prefill",
        "adakv(snapkv(window_size=4))": "shared",
        "pyramidkv(window_size=4)": "shared",
        decoding: "decoding",
    }
    by_press = {press: [r["prediction"] for r in rows if r["press"] == press] for press in ("knorm", own)}
    assert by_press["knorm"] == by_press[own]
    prefill = [r for r in rows if r["press"] != decoding]
    assert all(r["kept_tokens"] == 200 for r in prefill), "AdaKV masks what it evicts: 200 keys visible per head"
    assert all(r["kept_tokens"] == r["history_tokens"] for r in rows if r["press"] == decoding), "prefilled whole"
    paths = json.loads((output / "run.json").read_text())["config"]["paths"]
    assert paths[own] == "its own prefill" and paths["knorm"].startswith("shared prefill")
    assert paths[decoding] == "compresses while decoding"


def test_a_press_that_refuses_the_history_is_a_failed_cell_and_the_stream_goes_on(model_dir, data_file, tmp_path):
    """SnapKV with a window longer than the history refuses every question: failed rows with the press's reason;
    the other presses answer. (A refusal known before the model loads, such as RMM with a lag the token budget
    cannot hold, is an error instead: tests/test_bad_input.py.)"""
    output = tmp_path / "refused"
    wide = "snapkv(window_size=5000)"
    assert locomo(model_dir, data_file, output, "--presses", "full", wide, "h2o") == 0
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    failed = [r for r in rows if r["press"] == wide]
    assert len(failed) == 4 and all(r["error"].startswith("SnapKVPress: ") for r in failed)
    assert all("prediction" in r for r in rows if r["press"] != wide)
    assert "failed" in (output / "scorecard.md").read_text()
