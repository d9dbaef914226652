"""LoCoMo conversations (``locomo10.json``): from ``--data`` / ``LOCOMO_PATH``, or with the network the
official file of the snap-research/locomo repository, downloaded once, checked and cached."""

from __future__ import annotations

import hashlib
import os
import re
import urllib.request
from pathlib import Path

from evaluation.errors import EvaluationError
from evaluation.protocols.streaming.episodes import Conversation, Question, Session, Turn
from evaluation.runs.json_rows import load_json_rows
from evaluation.runs.models import cache_root

LOCOMO_URL = "https://raw.githubusercontent.com/snap-research/locomo/main/data/locomo10.json"
LOCOMO_SHA256 = "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"


def local_path(path: str | None) -> Path | None:
    """The file a run reads without the network: the one given, else ``$LOCOMO_PATH``, else the cached official
    download; None when a run would download it."""
    given = path or os.environ.get("LOCOMO_PATH")
    if given is not None:
        if not Path(given).is_file():
            raise EvaluationError(f"LoCoMo data file {given} not found: pass --data PATH/TO/locomo10.json")
        return Path(given)
    target = cache_root() / "data" / "locomo" / "locomo10.json"
    return target if target.is_file() else None


def resolve_path(path: str | None) -> Path:
    """The file to read: ``local_path``, else the official file, downloaded once into the cache."""
    found = local_path(path)
    if found is not None:
        return found
    target = cache_root() / "data" / "locomo" / "locomo10.json"
    try:
        with urllib.request.urlopen(LOCOMO_URL, timeout=60) as response:
            payload = response.read()
    except OSError as error:
        raise EvaluationError(
            f"no LoCoMo data: no --data or LOCOMO_PATH was given, and downloading {LOCOMO_URL} failed ({error}). "
            "Pass --data PATH/TO/locomo10.json."
        ) from error
    if hashlib.sha256(payload).hexdigest() != LOCOMO_SHA256:
        raise EvaluationError(f"the file downloaded from {LOCOMO_URL} does not have the expected sha256")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(payload)
    return target


CATEGORY_NUMBERS = range(1, 6)


def parse_conversation(raw: dict) -> Conversation:
    """One conversation of ``locomo10.json``; a key whose value is null is absent."""
    conversation = {key: value for key, value in raw["conversation"].items() if value is not None}
    numbers = sorted(int(key.split("_")[1]) for key in conversation if re.fullmatch(r"session_\d+", key))
    sessions = [
        Session(
            number,
            conversation[f"session_{number}_date_time"],
            [
                Turn(t["speaker"], t["dia_id"], t["text"], t.get("blip_caption"))
                for t in conversation[f"session_{number}"]
            ],
        )
        for number in numbers
    ]
    if not sessions:
        raise ValueError(f"{raw['sample_id']} has no sessions to stream")
    questions = []
    for i, q in enumerate(raw["qa"]):
        category = int(q["category"])
        where = f"{raw['sample_id']} question {i}"
        if category not in CATEGORY_NUMBERS:
            raise ValueError(f"{where} has category {category}; LoCoMo's are 1 to 5")
        if category != 5 and q.get("answer") is None:
            raise ValueError(f"{where} (category {category}) has no answer to score against")
        question = Question(
            i, q["question"], q.get("answer"), q.get("evidence") or [], category, q.get("adversarial_answer")
        )
        absent = sorted(question.evidence_sessions - set(numbers))
        if absent:
            raise ValueError(f"{where} cites evidence in session(s) {absent}, which the conversation does not hold")
        questions.append(question)
    return Conversation(raw["sample_id"], conversation["speaker_a"], conversation["speaker_b"], sessions, questions)


def load_conversations(path: Path) -> list[Conversation]:
    """Every conversation of a ``locomo10.json``, in file order."""
    conversations = []
    for index, item in enumerate(load_json_rows(path)):
        try:
            conversations.append(parse_conversation(item))
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise EvaluationError(
                f"{path}: conversation {index} is malformed ({type(error).__name__}: {error})"
            ) from error
    seen = [c.sample_id for c in conversations]
    twice = sorted({name for name in seen if seen.count(name) > 1})
    if twice:
        raise EvaluationError(f"{path}: sample_id {', '.join(twice)} names two conversations; give each its own id")
    return conversations
