"""Each official LongBench scoring rule, on hand-made cases."""

from __future__ import annotations

import json

import pytest

from evaluation.cli.main import main
from evaluation.metrics.longbench import (
    classification_score,
    code_sim_score,
    count_score,
    normalize_answer,
    qa_f1_score,
    retrieval_score,
    rouge_score,
    sample_score,
    task_score,
)


def test_normalization_drops_case_punctuation_articles_and_extra_space():
    assert normalize_answer("The  Cat, sat on a MAT!") == "cat sat on mat"
    assert normalize_answer("an apple-pie") == "applepie"


def test_qa_f1_is_token_f1_on_normalized_text_without_stemming():
    assert qa_f1_score("the cat sat on the mat", "A cat sat") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert qa_f1_score("cats", "cat") == 0.0
    assert qa_f1_score("", "cat") == 0.0


def test_rouge_is_the_rouge_packages_rouge_l_f():
    assert rouge_score("a b c d", "a c d e") == pytest.approx(0.75)
    # the package counts distinct reference words: recall 3/5 here, not 3/6
    assert rouge_score("the cat sat", "the cat sat on the mat") == pytest.approx(0.75)
    assert rouge_score("", "anything") == 0.0


def test_classification_scores_one_over_the_number_of_matched_classes():
    classes = ["Location", "Human being", "Numeric value", "Entity"]
    assert classification_score("Location", "Location", all_classes=classes) == 1.0
    assert classification_score("Location or Entity", "Location", all_classes=classes) == 0.5
    assert classification_score("Entity", "Location", all_classes=classes) == 0.0


def test_classification_drops_matches_inside_the_gold_label_as_the_official_loop_does():
    assert classification_score("Human being", "Human being", all_classes=["Human", "Human being"]) == 1.0
    # After dropping "Hu", the official loop never examines "Human", which therefore stays a match.
    assert classification_score("Human being", "Human being", all_classes=["Hu", "Human", "Human being"]) == 0.5


def test_count_and_retrieval_score_the_share_of_right_integers():
    assert count_score("There are 3 unique paragraphs, not 4", "3") == 0.5
    assert count_score("no idea", "3") == 0.0
    assert retrieval_score("Paragraph 12", "Paragraph 12") == 1.0
    assert retrieval_score("Paragraph 1 or Paragraph 12", "Paragraph 12") == 0.5
    assert retrieval_score("none", "Paragraph 12") == 0.0


def test_code_sim_uses_the_first_line_without_comment_or_fence_marks():
    assert code_sim_score("```python\n# set x\nx = foo(1)\ny = 2", "x = foo(1)") == 1.0
    assert code_sim_score("abcd", "abce") == pytest.approx(0.75)
    assert code_sim_score("// only\n# comments", "x") == 0.0


@pytest.mark.parametrize(
    ("prediction", "gold", "percent"),
    [
        # lengths 8 + 8, longest common subsequence m: 100 x 2m / 16, rounded half to even as Python's round
        ("abcdefgh", "aijklmno", 12),  # m = 1: 12.5
        ("abcdefgh", "abcijklm", 38),  # m = 3: 37.5
        ("abcdefgh", "abcdeijk", 62),  # m = 5: 62.5
        ("abcdefgh", "abcdefgi", 88),  # m = 7: 87.5
        ("abc", "abd", 67),  # m = 2 of 6: 66.67
        ("ab", "ba", 50),  # m = 1 of 4
        ("", "", 100),
        ("", "x", 0),
    ],
)
def test_code_sim_is_fuzzywuzzys_integer_percentage(prediction, gold, percent):
    assert code_sim_score(prediction, gold) == percent / 100


def test_first_line_rule_and_max_over_gold_answers():
    classes = ["Location", "Numeric value"]
    assert sample_score("trec", "\nLocation\nNumeric value", ["Location"], classes) == 1.0
    assert sample_score("hotpotqa", "\nParis\nFrance", ["Paris"], None) < 1.0
    assert sample_score("hotpotqa", "Paris", ["the city of Lyon", "Paris"], None) == 1.0
    with pytest.raises(ValueError, match="known tasks"):
        sample_score("dureader", "x", ["x"], None)


def test_task_score_is_100_times_the_mean_rounded_to_2_decimals():
    assert task_score([1.0, 0.0, 0.5]) == 50.0
    assert task_score([1 / 3]) == 33.33


def test_rescoring_command(tmp_path, capsys):
    rows = [
        {"task": "hotpotqa", "prediction": "Paris", "answers": ["Paris"], "all_classes": None},
        {"task": "trec", "prediction": "Location", "answers": ["Location"], "all_classes": ["Location", "Entity"]},
        {"task": "hotpotqa", "prediction": "Lyon", "answers": ["Paris"], "all_classes": None},
    ]
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["score", "longbench", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"hotpotqa": 50.0, "trec": 100.0}
    assert main(["score", "longbench", str(path), "--per-row"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == [1.0, 1.0, 0.0]


def test_a_generation_repeats_itself_when_one_sentence_comes_three_times():
    from evaluation.protocols.longbench.degeneracy import degeneracy_lines, repeats_itself

    assert repeats_itself("The storm hit. The storm hit! the storm hit.\nThen calm.")
    assert not repeats_itself("The storm hit. The storm hit. Then calm.")
    assert not repeats_itself("")
    rows = [
        {
            "task": "multi_news",
            "budget_label": "keep 50%",
            "press": "h2o",
            "generated_tokens": tokens,
            "prediction": text,
        }
        for tokens, text in [(512, "A. A. A."), (100, "A. B."), (512, "C."), (20, "D.")]
    ]
    table = degeneracy_lines(rows, {"multi_news": 512})
    assert "| multi_news | keep 50% | h2o | 4 | 50% | 25% |" in table
