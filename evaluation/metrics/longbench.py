"""LongBench v1 metrics (Bai et al., ACL 2024): the rules of the official ``eval.py`` and ``metrics.py``.

Each sample scores the max over its gold answers; a task scores 100 x the mean, rounded to 2 decimals.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable, Sequence

from rapidfuzz.distance import Indel
from rouge import Rouge

from evaluation.metrics.f1 import token_f1

FIRST_LINE_TASKS = frozenset({"trec", "triviaqa", "samsum", "lsht"})


def normalize_answer(text: str) -> str:
    """Lowercase, strip ASCII punctuation, drop the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def qa_f1_score(prediction: str, gold: str, **_: object) -> float:
    return token_f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


def rouge_score(prediction: str, gold: str, **_: object) -> float:
    """ROUGE-L F-measure of the ``rouge`` package on the raw strings; any exception (an empty prediction) is 0."""
    try:
        return Rouge().get_scores([prediction], [gold], avg=True)["rouge-l"]["f"]
    except Exception:  # the official rule: whatever the package rejects (an empty prediction) scores 0
        return 0.0


def classification_score(prediction: str, gold: str, all_classes: Iterable[str] | None = None, **_: object) -> float:
    """1 / (number of matched class names) if the gold label is among them, else 0.

    Class names that occur in the prediction are matches; a match that is a substring of the gold label but not
    equal to it is dropped. The official loop removes items from the list it iterates over, so the match right
    after a dropped one is never examined; that behaviour is reproduced.
    """
    matches = [name for name in all_classes or () if name in prediction]
    kept: list[str] = []
    skip_next = False
    for name in matches:
        if skip_next:
            kept.append(name)
            skip_next = False
        elif name in gold and name != gold:
            skip_next = True
        else:
            kept.append(name)
    return 1.0 / len(kept) if gold in kept else 0.0


def count_score(prediction: str, gold: str, **_: object) -> float:
    """Fraction of the integers in the prediction equal to the gold count."""
    numbers = re.findall(r"\d+", prediction)
    return sum(number == str(gold) for number in numbers) / len(numbers) if numbers else 0.0


def retrieval_score(prediction: str, gold: str, **_: object) -> float:
    """The gold is "Paragraph N": fraction of the integers in the prediction equal to N."""
    gold_id = re.findall(r"Paragraph (\d+)", gold)[0]
    numbers = re.findall(r"\d+", prediction)
    return sum(number == gold_id for number in numbers) / len(numbers) if numbers else 0.0


def code_sim_score(prediction: str, gold: str, **_: object) -> float:
    """fuzzywuzzy's ``fuzz.ratio`` / 100 between the gold line and the first prediction line with none of "`", "#",
    "//". That ratio is an integer percentage: ``int(round(100 x r))``, Python's round (half to even), of the Indel
    similarity r = (len(a) + len(b) - distance) / (len(a) + len(b)) that python-Levenshtein computes; equal strings
    score 100 and an empty one 0."""
    first_code_line = next(
        (line for line in prediction.lstrip("\n").split("\n") if not any(mark in line for mark in ("`", "#", "//"))),
        "",
    )
    return fuzzy_ratio(first_code_line, gold) / 100


def fuzzy_ratio(first: str, second: str) -> int:
    """fuzzywuzzy's ``fuzz.ratio``: the Indel similarity of two strings as an integer percentage."""
    if first == second:
        return 100
    if not first or not second:
        return 0
    total = len(first) + len(second)
    return round(100 * ((total - Indel.distance(first, second)) / total))


Metric = Callable[..., float]
TASK_METRICS: dict[str, Metric] = {
    "narrativeqa": qa_f1_score,
    "qasper": qa_f1_score,
    "multifieldqa_en": qa_f1_score,
    "hotpotqa": qa_f1_score,
    "2wikimqa": qa_f1_score,
    "musique": qa_f1_score,
    "gov_report": rouge_score,
    "qmsum": rouge_score,
    "multi_news": rouge_score,
    "trec": classification_score,
    "triviaqa": qa_f1_score,
    "samsum": rouge_score,
    "passage_count": count_score,
    "passage_retrieval_en": retrieval_score,
    "lcc": code_sim_score,
    "repobench-p": code_sim_score,
}


def sample_score(task: str, prediction: str, answers: Sequence[str], all_classes: Sequence[str] | None) -> float:
    """One sample's score in [0, 1]: the max over its gold answers (first line only for the few-shot tasks)."""
    if task not in TASK_METRICS:
        raise ValueError(f"no LongBench metric for task {task!r}; known tasks: {', '.join(TASK_METRICS)}")
    if task in FIRST_LINE_TASKS:
        prediction = prediction.lstrip("\n").split("\n")[0]
    metric = TASK_METRICS[task]
    return max((metric(prediction, gold, all_classes=all_classes) for gold in answers), default=0.0)


def task_score(sample_scores: Sequence[float]) -> float:
    """100 x the mean sample score, rounded to 2 decimals."""
    return round(100 * sum(sample_scores) / len(sample_scores), 2)
