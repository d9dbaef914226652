"""RULER's string-match metrics, per sample in [0, 1], re-implemented from RULER's definition (lower-cased
containment of each reference in the prediction) and applied as KVPress's RULER scorer applies them: after
stripping the prediction and removing its control characters (U+0000 to U+001F, newlines included)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from evaluation.errors import EvaluationError

CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f]")


def clean_prediction(prediction: str) -> str:
    """The prediction as KVPress's scorer reads it: stripped, control characters removed, stripped again."""
    return CONTROL_CHARACTERS.sub("", prediction.strip()).strip()


def matches(prediction: str, answers: Sequence[str]) -> list[float]:
    """1.0 for each reference contained (lower-cased) in the prediction, else 0.0."""
    lowered = prediction.lower()
    return [1.0 if answer.lower() in lowered else 0.0 for answer in answers]


def string_match_all(prediction: str, answers: Sequence[str]) -> float:
    """The fraction of the references the prediction contains (RULER's metric for all tasks but QA)."""
    return sum(matches(prediction, answers)) / len(answers)


def string_match_part(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when the prediction contains any reference, else 0.0 (RULER's metric for QA)."""
    return max(matches(prediction, answers))


METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "string_match_all": string_match_all,
    "string_match_part": string_match_part,
}


def score(metric_name: str, prediction: str, answers: Sequence[str]) -> float:
    """One sample's score in [0, 1] under the named metric, on the cleaned prediction."""
    if metric_name not in METRICS:
        raise EvaluationError(f"unknown RULER metric {metric_name!r}: known are {', '.join(METRICS)}")
    if not answers:
        raise EvaluationError("a RULER sample needs at least one reference answer")
    return METRICS[metric_name](clean_prediction(prediction), answers)
