"""The synthetic families as streamed datasets: generated from the run's settings, asked with their own
prompts, scored by string match."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import asdict

from evaluation.errors import EvaluationError
from evaluation.locomo.data import Conversation, Question, Session
from evaluation.locomo.render import header, render_session
from evaluation.locomo.runner import LoCoMoConfig, StreamTask
from evaluation.scorecard import Benchmark
from evaluation.synthetic import multiquery, reuse

OVERALL = "overall"
REUSE_CONDITIONS = {"first": "first ask", "reuse": "asked again", "fresh": "never asked (control)"}
DOCUMENT_HEADER = "Read the document below. Questions about it follow.\n\n"


def string_match(prediction: str, answer: str) -> float:
    """1 when the answer appears in the prediction as a whole word or number (case-insensitive), else 0:
    RULER's containment rule, except that "48213" does not count as holding "4821"."""
    return float(re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", prediction, re.IGNORECASE) is not None)


def sentence_answer(question: Question) -> str:
    """The gold answer as the history records it: the question's subject and the value, as a sentence ("What is
    the code of Mia's locker?" -> "The code of Mia's locker is 4821."). Whole sentences give a small model the
    answer format from the turns before (measured on SmolLM2: 7 of 8 codes, against 3 of 8 for bare codes)."""
    subject = question.question.removeprefix("What is ").removesuffix("?")
    return f"{subject[0].upper()}{subject[1:]} is {question.answer}."


def scored(conversation: Conversation, question: Question, prediction: str) -> tuple[str, float]:
    return prediction, string_match(prediction, str(question.answer))


def generated(
    config: LoCoMoConfig, generate: Callable[..., list[Conversation]]
) -> tuple[dict[str, str], list[Conversation]]:
    """The episodes of ``config.episodes`` and their fingerprint (a resumed run must regenerate the same)."""
    try:
        conversations = generate(**config.episodes)
    except (TypeError, ValueError) as error:
        raise EvaluationError(f"{config.task} episodes {config.episodes}: {error}") from error
    text = json.dumps([asdict(conversation) for conversation in conversations], sort_keys=True)
    return {"episodes": hashlib.sha256(text.encode()).hexdigest()}, conversations


def render_document(session: Session) -> str:
    return "\n".join(turn.text for turn in session.turns) + "\n\n"


def length_of(conversation: Conversation) -> str:
    """A multiquery episode's nominal document length, from its id (mq-<length>-<index>)."""
    return conversation.sample_id.split("-")[1]


def _benchmark(name: str, conditions: Callable[[dict], list[str]], order: tuple[str, ...]) -> Benchmark:
    return Benchmark(name, conditions, lambda row: (row["conversation"], row["question_index"]), 100, 1, order)


REUSE = StreamTask(
    name="reuse",
    load=lambda config: generated(config, reuse.reuse_episodes),
    header=header,
    render_session=render_session,
    question_prompt=lambda conversation, question: question.question,
    gold_answer=sentence_answer,
    scored=scored,
    benchmark=_benchmark(
        "Reuse", lambda row: [OVERALL, REUSE_CONDITIONS[row["kind"]]], (OVERALL, *REUSE_CONDITIONS.values())
    ),
    metric="Accuracy (%, string match of the code)",
    row_fields=lambda conversation, question: {"family": "reuse", "kind": question.kind},
)

MULTIQUERY = StreamTask(
    name="multiquery",
    load=lambda config: generated(config, multiquery.multiquery_episodes),
    header=lambda conversation: DOCUMENT_HEADER,
    render_session=render_document,
    question_prompt=lambda conversation, question: question.question,
    gold_answer=sentence_answer,
    scored=scored,
    benchmark=_benchmark(
        "Multi-query",
        lambda row: [OVERALL, f"{row['length']} context", row["kind"]],
        (OVERALL, *multiquery.KINDS),
    ),
    metric="Accuracy (%, string match of the number)",
    row_fields=lambda conversation, question: {
        "family": "multiquery",
        "kind": question.kind,
        "length": length_of(conversation),
    },
)

SYNTHETIC_TASKS = {task.name: task for task in (REUSE, MULTIQUERY)}
