"""LoCoMo conversations (``locomo10.json``): from ``--data``, else ``locomo/locomo10.json`` of the shared data
(``evaluation.runs.data_location``), or with the network the
official file of the snap-research/locomo repository, downloaded once, checked and cached."""

from __future__ import annotations

import hashlib
import math
import re
import urllib.request
from pathlib import Path

from evaluation.errors import EvaluationError
from evaluation.protocols.streaming.episodes import Conversation, Question, Session, Turn
from evaluation.runs.data_location import located
from evaluation.runs.files import write_atomically
from evaluation.runs.json_rows import json_kind, load_json_rows, text_list_kind
from evaluation.runs.models import cache_root

LOCOMO_URL = "https://raw.githubusercontent.com/snap-research/locomo/main/data/locomo10.json"
LOCOMO_SHA256 = "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"


def local_path(path: str | None) -> Path | None:
    """The file a run reads without the network: the one given, else ``locomo/locomo10.json`` of the shared data
    (``data_location.located``), else the cached official download; None when a run would download it."""
    given = located(path, "locomo/locomo10.json")
    if given is not None:
        if not given.is_file():
            raise EvaluationError(f"LoCoMo data file {given} not found: pass --data PATH/TO/locomo10.json")
        return given
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
            f"no LoCoMo data: no --data, KVET_SHARED_DATA or shared/data was found, and downloading {LOCOMO_URL} "
            f"failed ({error}). "
            "Pass --data PATH/TO/locomo10.json."
        ) from error
    if hashlib.sha256(payload).hexdigest() != LOCOMO_SHA256:
        raise EvaluationError(f"the file downloaded from {LOCOMO_URL} does not have the expected sha256")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, payload)
    return target


CATEGORY_NUMBERS = range(1, 6)
SESSION = re.compile(r"session_(\d+)")


def parse_conversation(raw: dict) -> Conversation:
    """One conversation of ``locomo10.json``, every field the run reads checked; a key whose value is null is
    absent.

    Raises
    ------
    ValueError
        Naming the question or turn and the field: what it holds and what it should.
    """
    sample_id = raw.get("sample_id")
    if not isinstance(sample_id, str):
        raise ValueError(f"sample_id must be a string, not {json_kind(sample_id)}")
    conversation = raw.get("conversation")
    if not isinstance(conversation, dict):
        raise ValueError(f"{sample_id}: conversation must be an object, not {json_kind(conversation)}")
    conversation = {key: value for key, value in conversation.items() if value is not None}
    for speaker in ("speaker_a", "speaker_b"):
        checked_text(conversation.get(speaker), f"{sample_id}: conversation.{speaker}")
    numbers = sorted(int(match[1]) for match in map(SESSION.fullmatch, conversation) if match)
    sessions = [session(conversation, number, sample_id) for number in numbers]
    if not sessions:
        raise ValueError(f"{sample_id} has no sessions to stream")
    qa = raw.get("qa")
    if not isinstance(qa, list):
        raise ValueError(f"{sample_id}: qa must be a list of questions, not {json_kind(qa)}")
    if not qa:
        raise ValueError(f"{sample_id} has no questions, so nothing to ask: give it questions or leave it out")
    questions = [question(item, i, sample_id, numbers) for i, item in enumerate(qa)]
    return Conversation(sample_id, conversation["speaker_a"], conversation["speaker_b"], sessions, questions)


def checked_text(value: object, where: str) -> str:
    """``value``, a string; else a ``ValueError`` naming the field ``where``."""
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a string, not {json_kind(value)}")
    return value


def session(conversation: dict, number: int, sample_id: str) -> Session:
    """Session ``number`` of a conversation: its date and its turns, each field checked."""
    where = f"{sample_id}: conversation.session_{number}"
    turns = conversation[f"session_{number}"]
    if not isinstance(turns, list):
        raise ValueError(f"{where} must be a list of turns (objects), not {json_kind(turns)}")
    date = checked_text(conversation.get(f"session_{number}_date_time"), f"{where}_date_time")
    parsed = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise ValueError(f"{where}[{i}] must be a turn (an object), not {json_kind(turn)}")
        fields = [checked_text(turn.get(name), f"{where}[{i}].{name}") for name in ("speaker", "dia_id", "text")]
        caption = turn.get("blip_caption")
        parsed.append(Turn(*fields, None if caption is None else checked_text(caption, f"{where}[{i}].blip_caption")))
    return Session(number, date, parsed)


def question(item: object, index: int, sample_id: str, sessions: list[int]) -> Question:
    """Question ``index`` of a conversation, each field checked: its text, a category 1-5 (a whole number), an
    answer (a string or a number) for categories 1-4, a string adversarial answer, evidence in sessions the
    conversation holds."""
    where = f"{sample_id} question {index}"
    if not isinstance(item, dict):
        raise ValueError(f"{where} must be an object, not {json_kind(item)}")
    category, answer, adversarial = item.get("category"), item.get("answer"), item.get("adversarial_answer")
    if isinstance(category, bool) or not isinstance(category, int):
        raise ValueError(f"{where}: category must be a whole number 1 to 5, not {json_kind(category)}")
    if category not in CATEGORY_NUMBERS:
        raise ValueError(f"{where} has category {category}; LoCoMo's are 1 to 5")
    if answer is None and (category != 5 or adversarial is None):
        raise ValueError(f"{where} (category {category}) has no answer to score against")
    if answer is not None and not (isinstance(answer, str) or is_number(answer)):
        raise ValueError(f"{where}: answer must be a string or a number, not {json_kind(answer)}")
    if adversarial is not None:
        checked_text(adversarial, f"{where}: adversarial_answer")
    evidence = item.get("evidence") or []
    if text_list_kind(evidence):
        raise ValueError(f"{where}: evidence must be a list of strings, not {text_list_kind(evidence)}")
    parsed = Question(
        index, checked_text(item.get("question"), f"{where}: question"), answer, evidence, category, adversarial
    )
    absent = sorted(parsed.evidence_sessions - set(sessions))
    if absent:
        raise ValueError(f"{where} cites evidence in session(s) {absent}, which the conversation does not hold")
    return parsed


def is_number(value: object) -> bool:
    """Whether a JSON value is a finite number (not a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_conversations(path: Path) -> list[Conversation]:
    """Every conversation of a ``locomo10.json``, in file order, every field it reads checked.

    Raises
    ------
    EvaluationError
        One line naming the file, the conversation and the field.
    """
    conversations = []
    for index, item in enumerate(load_json_rows(path)):
        try:
            conversations.append(parse_conversation(item))
        except ValueError as error:
            raise EvaluationError(f"{path}: conversation {index}: {error}") from error
    seen = [c.sample_id for c in conversations]
    twice = sorted({name for name in seen if seen.count(name) > 1})
    if twice:
        raise EvaluationError(f"{path}: sample_id {', '.join(twice)} names two conversations; give each its own id")
    return conversations
