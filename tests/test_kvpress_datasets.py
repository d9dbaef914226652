"""KVPress's dataset registry and each benchmark's scoring rule, on hand cases worked out from the rule."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import pytest

from evaluation.errors import EvaluationError
from evaluation.metrics import kvpress as metrics
from evaluation.metrics.kvpress import (
    ClozeCounts,
    cloze_aggregate,
    cloze_counts,
    length_bucket,
    length_buckets,
    loogle_refused,
    loogle_text_metrics,
    needle_rouge_scores,
)
from evaluation.protocols.kvpress.columns import KVPressExample, read_examples
from evaluation.protocols.kvpress.datasets import (
    KVPRESS_DATASETS,
    example_of_hub_row,
    kvpress_dataset,
    load_hub,
    offline_hint,
    score_example,
)

KVPRESS_REGISTRY = {
    "loogle": "simonjegou/loogle",
    "ruler": "simonjegou/ruler",
    "zero_scrolls": "simonjegou/zero_scrolls",
    "infinitebench": "MaxJeblick/InfiniteBench",
    "longbench": "Xnhyacinth/LongBench",
    "longbench-e": "Xnhyacinth/LongBench",
    "longbench-v2": "simonjegou/LongBench-v2",
    "needle_in_haystack": "alessiodevoto/paul_graham_essays",
    "aime25": "alessiodevoto/aime25",
    "math500": "alessiodevoto/math500",
}


def example(task: str, *answers: str, length: int | None = None) -> KVPressExample:
    """An example of ``task`` with these gold answers (its text columns do not enter any rule)."""
    return KVPressExample(
        id="0",
        task=task,
        context="c",
        question="q",
        answer_prefix="",
        answers=answers,
        max_new_tokens=8,
        length=length,
    )


# --- registry ------------------------------------------------------------------------------------------------------


def test_the_registry_is_kvpress_dataset_registry_by_name_and_hub_id():
    """The names and hub ids of DATASET_REGISTRY in KVPress's evaluation/evaluate_registry.py (NVIDIA/kvpress at
    8bb29b9), in its order."""
    assert list(KVPRESS_DATASETS) == list(KVPRESS_REGISTRY)
    assert {name: dataset.hub_id for name, dataset in KVPRESS_DATASETS.items()} == KVPRESS_REGISTRY
    assert all(dataset.name == name and dataset.split == "test" for name, dataset in KVPRESS_DATASETS.items())


def test_every_dataset_names_a_scoring_rule():
    assert {dataset.scorer for dataset in KVPRESS_DATASETS.values()} <= set(metrics.RULES)
    assert set(metrics.SCALE) == set(metrics.RULES)


def test_an_unknown_name_is_one_line_listing_the_known_ones():
    with pytest.raises(EvaluationError) as error:
        kvpress_dataset("ruler-128k")
    message = str(error.value)
    assert "\n" not in message and "'ruler-128k'" in message
    assert all(name in message for name in KVPRESS_REGISTRY)
    with pytest.raises(EvaluationError):
        score_example("ruler-128k", "x", example("qa_1", "x"))


def test_the_offline_hint_names_the_hub_id_and_a_local_file():
    hint = offline_hint("longbench-v2")
    assert "\n" not in hint and "simonjegou/LongBench-v2" in hint and "--data FILE.parquet" in hint


def test_hub_rows_become_examples_with_the_answer_column_each_dataset_uses():
    longbench_e = kvpress_dataset("longbench-e")
    row = {
        "context": "c",
        "question": "q",
        "answer_prefix": "Answer:",
        "answers": ["Paris", "paris"],
        "all_classes": None,
        "length": 5123,
        "task": "hotpotqa",
        "max_new_tokens": 52,
    }
    converted = example_of_hub_row(longbench_e, row, 1, Path("hub"))
    assert converted.answers == ("Paris", "paris") and converted.task == "hotpotqa" and converted.length == 5123

    aime = {"context": "", "question": "q", "answer_prefix": "", "answer": 42, "max_new_tokens": 1000}
    converted = example_of_hub_row(kvpress_dataset("aime25"), aime, 1, Path("hub"))
    assert converted.answers == ("42",) and converted.task == "aime25"

    needle = {"context": "hay", "needle": "The key is 7.", "question": "q", "answer_prefix": "", "max_new_tokens": 9}
    converted = example_of_hub_row(kvpress_dataset("needle_in_haystack"), needle, 1, Path("hub"))
    assert converted.answers == ("The key is 7.",) and converted.task == "needle_in_haystack"


def test_a_hub_row_missing_a_column_is_one_line():
    with pytest.raises(EvaluationError) as error:
        example_of_hub_row(kvpress_dataset("math500"), {"question": "q", "answer": "1"}, 1, Path("alessiodevoto/m"))
    assert "\n" not in str(error.value) and "'max_new_tokens'" in str(error.value)


def test_load_hub_reads_the_test_split_of_the_hub_id_and_data_dir(monkeypatch):
    calls = []
    row = {"context": "c", "question": "q", "answer_prefix": "", "answer": ["x"], "task": "qa_1", "max_new_tokens": 8}

    def load_dataset(path, data_dir=None, split=None):
        calls.append((path, data_dir, split))
        return [row]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    examples = load_hub(kvpress_dataset("ruler"), data_dir="4096")
    assert calls == [("simonjegou/ruler", "4096", "test")]
    assert examples == [example("qa_1", "x")]


def test_a_file_missing_a_column_is_refused_in_one_line(tmp_path):
    import pandas as pd

    path = tmp_path / "ruler.parquet"
    pd.DataFrame(
        [{"context": "c", "question": "q", "answer_prefix": "", "answer": ["x"], "max_new_tokens": 4}]
    ).to_parquet(path, index=False)
    with pytest.raises(EvaluationError) as error:
        read_examples(path)
    assert "\n" not in str(error.value) and "'task'" in str(error.value)


# --- RULER ---------------------------------------------------------------------------------------------------------


def test_ruler_qa_needs_any_answer_and_other_tasks_the_fraction_of_answers():
    assert score_example("ruler", "It is PARIS.", example("qa_1", "Paris", "Lyon")) == 1.0
    assert score_example("ruler", "123 and 789", example("niah_multivalue", "123", "456")) == 0.5
    assert score_example("ruler", "123 and 456", example("niah_multivalue", "123", "456")) == 1.0
    assert score_example("ruler", "nothing", example("vt", "X1", "X2")) == 0.0


def test_ruler_drops_control_characters_before_matching():
    assert score_example("ruler", " 12\n34 ", example("niah_single_1", "1234")) == 1.0
    assert score_example("ruler", "12 34", example("niah_single_1", "1234")) == 0.0


# --- LooGLE --------------------------------------------------------------------------------------------------------

CLOZE_GOLD = '{"<mask-0>": "Bob Smith", "<mask-1>": "Alice"}'


def test_loogle_cloze_counts_exact_and_shared_word_matches():
    both = cloze_counts('{"<mask-0>": "Bob Smith", "<mask-1>": "Carol"}', CLOZE_GOLD)
    assert both == ClozeCounts(exact=1, exact_count=2, partial=1, partial_count=2)
    word = cloze_counts('{"<mask-0>": "Smith"}', CLOZE_GOLD)
    assert word == ClozeCounts(exact=0, exact_count=2, partial=1, partial_count=2)
    assert cloze_counts("Bob Smith and Alice", CLOZE_GOLD) == ClozeCounts(0, 1, 0, 2)
    assert score_example("loogle", '{"<mask-0>": "Bob Smith"}', example("shortdep_cloze", CLOZE_GOLD)) == 0.5


def test_loogle_cloze_aggregate_is_summed_matches_over_summed_counts():
    counts = [ClozeCounts(1, 2, 1, 2), ClozeCounts(0, 1, 0, 2)]
    assert cloze_aggregate(counts) == {"exact_match": round(1 / 3, 4), "partial_match": 0.25}


def test_loogle_text_metrics_are_bleu_and_rouge_recall():
    scores = loogle_text_metrics("cat sat", "cat sat on mat")
    assert scores["rouge-1"] == pytest.approx(2 / 4)
    assert scores["rouge-2"] == pytest.approx(1 / 3)
    assert scores["rouge-l"] == pytest.approx(2 / 4)
    assert scores["bleu1"] == pytest.approx(math.exp(1 - 4 / 2))
    assert scores["bleu4"] == pytest.approx(0.0, abs=1e-9)
    assert score_example("loogle", "cat sat", example("shortdep_qa", "cat sat on mat")) == pytest.approx(0.5)
    assert loogle_text_metrics("", "cat sat")["rouge-l"] == 0.0


def test_loogle_meteor_and_bert_are_refused_naming_what_is_missing():
    for metric, missing in (("meteor", "wordnet"), ("bert", "bert-score")):
        with pytest.raises(EvaluationError, match=missing) as error:
            loogle_refused(metric)
        assert "\n" not in str(error.value)


# --- ZeroSCROLLS ---------------------------------------------------------------------------------------------------


def test_zero_scrolls_is_refused_in_one_line():
    with pytest.raises(EvaluationError, match="hidden") as error:
        score_example("zero_scrolls", "anything", example("qasper", ""))
    assert "\n" not in str(error.value)


# --- InfiniteBench -------------------------------------------------------------------------------------------------


def test_infinitebench_passkey_and_number_string_compare_the_first_integer():
    assert score_example("infinitebench", "The pass key is 71432.", example("passkey", "71432")) == 1.0
    assert score_example("infinitebench", "7143 2", example("passkey", "71432")) == 0.0
    assert score_example("infinitebench", "no digits", example("number_string", "22")) == 0.0


def test_infinitebench_kv_retrieval_finds_the_value_among_the_words():
    value = "00a00042-6bcb"
    assert score_example("infinitebench", f'"{value}".', example("kv_retrieval", value)) == 1.0
    assert score_example("infinitebench", f"{value}x", example("kv_retrieval", value)) == 0.0


def test_infinitebench_dialogue_and_qa():
    assert score_example("infinitebench", "It is probably Ace.", example("longdialogue_qa_eng", "ACE", "ACE R")) == 1.0
    assert score_example("infinitebench", "The answer is Peyton", example("longbook_qa_eng", "Peyton")) == 0.5
    assert score_example("infinitebench", "北京。", example("longbook_qa_chn", "北京")) == 1.0
    assert score_example("infinitebench", "在北京", example("longbook_qa_chn", "北京")) == pytest.approx(0.8)


def test_infinitebench_multiple_choice_cascade():
    choice = example("longbook_choice_eng", "B")
    assert score_example("infinitebench", "The answer is (B)", choice) == 1.0
    assert score_example("infinitebench", "B. Taking care of Totty", choice) == 1.0
    assert score_example("infinitebench", "A or B? I think A", choice) == 0.0
    assert score_example("infinitebench", "my answer is: Bx", choice) == 1.0
    assert score_example("infinitebench", "maybe AB", choice) == 0.0
    assert score_example("infinitebench", "", choice) == 0.0


def test_infinitebench_tasks_kvpress_cannot_score_are_refused_in_one_line():
    for task in ("code_run", "code_debug", "math_find", "math_calc", "longbook_sum_eng"):
        with pytest.raises(EvaluationError, match=task) as error:
            score_example("infinitebench", "3", example(task, "3"))
        assert "\n" not in str(error.value)


# --- LongBench and LongBench-E -------------------------------------------------------------------------------------


def test_longbench_strips_leading_whitespace_before_the_first_line_and_the_metric():
    assert score_example("longbench", " \nParis\nLondon", example("triviaqa", "Paris")) == 1.0
    assert score_example("longbench", "  Paris", example("hotpotqa", "Paris")) == 1.0
    assert score_example("longbench", " x = 1", example("lcc", "x = 1")) == 1.0


def test_longbench_e_scores_the_prediction_as_it_is():
    assert score_example("longbench-e", " \nParis\nLondon", example("triviaqa", "Paris")) == 0.0
    assert score_example("longbench-e", " x = 1", example("lcc-e", "x = 1")) == pytest.approx(0.91)


def test_longbench_classification_needs_its_classes():
    with pytest.raises(EvaluationError, match="all_classes"):
        score_example("longbench", "city", example("trec", "city"))
    assert score_example("longbench", "city", example("trec", "city"), all_classes=["city", "country"]) == 1.0


def test_longbench_e_buckets_by_length_in_words():
    assert [length_bucket(length) for length in (0, 3999, 4000, 7999, 8000)] == ["0-4k", "0-4k", "4-8k", "4-8k", "8k+"]
    assert length_buckets([1.0, 0.0, 0.5], [100, 5000, 9000]) == {"0-4k": 100.0, "4-8k": 0.0, "8k+": 50.0}
    assert math.isnan(length_buckets([1.0], [100])["8k+"])


# --- LongBench-v2 --------------------------------------------------------------------------------------------------


def test_longbench_v2_needs_the_correct_answer_sentence():
    gold = example("longbench-v2", "B")
    assert score_example("longbench-v2", "The correct answer is (B).", gold) == 1.0
    assert score_example("longbench-v2", "**The correct answer is B**", gold) == 1.0
    assert score_example("longbench-v2", "The answer is (B)", gold) == 0.0
    assert score_example("longbench-v2", "The correct answer is (C)", gold) == 0.0


# --- Needle in a haystack ------------------------------------------------------------------------------------------

NEEDLE = "the best thing to do in san francisco is eat a sandwich"


def test_needle_is_rouge_1_f_with_the_needle_as_hypothesis():
    scores = needle_rouge_scores("eat a sandwich", NEEDLE)
    assert scores["rouge-1"]["p"] == pytest.approx(3 / 12) and scores["rouge-1"]["r"] == pytest.approx(1.0)
    assert score_example("needle_in_haystack", "eat a sandwich", example("niah", NEEDLE)) == pytest.approx(0.4)
    assert score_example("needle_in_haystack", f" {NEEDLE} ", example("niah", NEEDLE)) == pytest.approx(1.0)
    assert score_example("needle_in_haystack", "  ", example("niah", NEEDLE)) == 0.0
    assert score_example("needle_in_haystack", " ... ", example("niah", NEEDLE)) == 0.0  # rouge finds no word


# --- AIME25 and MATH-500 -------------------------------------------------------------------------------------------


def test_aime25_compares_the_last_boxed_answer():
    assert score_example("aime25", "so \\boxed{42}.", example("aime25", "42")) == 1.0
    assert score_example("aime25", "\\boxed{41} no, \\boxed{42}", example("aime25", "42")) == 1.0
    assert score_example("aime25", "42", example("aime25", "42")) == 1.0
    assert score_example("aime25", "the answer is 42", example("aime25", "42")) == 0.0


def test_math500_compares_the_first_boxed_answer_up_to_its_first_brace():
    assert score_example("math500", "\\boxed{42} or \\boxed{41}", example("math500", "42")) == 1.0
    assert score_example("math500", "42", example("math500", "42")) == 0.0
    assert score_example("math500", "\\boxed{\\frac{1}{2}}", example("math500", "\\frac{1}{2}")) == 0.0
    assert metrics.answered("\\boxed{1}") and not metrics.answered("1")
