"""LoCoMo QA scoring (Maharana et al., ACL 2024): the rules of the official ``evaluation.py``.

Answers are normalized (commas deleted, lowercased, ASCII punctuation stripped, the words a/an/the/and
removed, whitespace collapsed), every token is Porter-stemmed (NLTK) and scored by token F1.
"""

from __future__ import annotations

import re
import string
from functools import cache

from evaluation.metrics.f1 import token_f1

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
PAPER_ORDER = (4, 1, 2, 3, 5)
ABSTENTIONS = ("no information available", "not mentioned")


@cache
def _stemmer():
    from nltk.stem import PorterStemmer  # NLTK loads slowly: only when something is scored

    return PorterStemmer()


def normalize_answer(text: str) -> str:
    text = str(text).replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the|and)\b", " ", text)
    return " ".join(text.split())


def stemmed_f1(prediction: str, gold: str) -> float:
    stem = _stemmer().stem
    return token_f1(
        [stem(w) for w in normalize_answer(prediction).split()], [stem(w) for w in normalize_answer(gold).split()]
    )


def multi_hop_f1(prediction: str, gold: str) -> float:
    """Split both on commas; each gold part takes its best F1 over the prediction parts; average over gold parts."""
    predictions = [part.strip() for part in prediction.split(",")]
    golds = [part.strip() for part in gold.split(",")]
    return sum(max(stemmed_f1(p, g) for p in predictions) for g in golds) / len(golds)


def score(category: int, prediction: str, answer: str | int) -> float:
    """One question's score in [0, 1] under its category's rule."""
    gold = str(answer)
    if category == 1:
        return multi_hop_f1(prediction, gold)
    if category == 3:
        return stemmed_f1(prediction, gold.split(";")[0].strip())
    if category in (2, 4):
        return stemmed_f1(prediction, gold)
    if category == 5:
        return float(any(phrase in prediction.lower() for phrase in ABSTENTIONS))
    raise ValueError(f"unknown LoCoMo category {category!r}; categories are 1 to 5")
