"""Where the questions go in the stream, and which sessions the history holds.

``file`` (the paper's): the conversation first, as much of it as fits the model's context (the oldest sessions
dropped), then every question in file order. ``evidence``: the sessions stream in one by one and each question
is asked right after the session holding its last evidence, so a model whose context holds only a few sessions
still sees the evidence; when the next session would overflow the context, the history restarts from its newest
sessions (half the context), re-prefilled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from evaluation.errors import EvaluationError
from evaluation.protocols.streaming.config import StreamConfig
from evaluation.protocols.streaming.episodes import Conversation, Question, Session
from evaluation.protocols.streaming.framing import Framing
from evaluation.protocols.streaming.task import StreamTask

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

StreamItem = tuple[str, object, int]  # ("session", text, n) or ("turn", (question, answer), n)


def select_conversations(conversations: list[Conversation], wanted: list[str] | None) -> list[Conversation]:
    if wanted is None:
        return conversations
    known = {c.sample_id: c for c in conversations}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise EvaluationError(f"unknown conversation(s) {unknown}; the data holds {', '.join(known)}")
    return [known[name] for name in wanted]


def asked_after_session(conversation: Conversation, question: Question) -> int:
    """The session the evidence placement asks ``question`` after: its last evidence session, else the last one."""
    return max(question.evidence_sessions, default=conversation.sessions[-1].number)


def asked_questions(conversation: Conversation, config: StreamConfig) -> list[Question]:
    """The first ``max_turns`` questions in the order the placement asks them: file order, or for the evidence
    placement stream order (by the session they are asked after, then file order)."""
    questions = conversation.questions
    if config.placement == "evidence":
        questions = sorted(questions, key=lambda q: (asked_after_session(conversation, q), q.index))
    return questions[: config.max_turns]


def fit_sessions(
    framing_for: Callable[[list[Session]], Framing], conversation: Conversation, limit: int
) -> list[Session]:
    """The newest sessions whose rendered conversation fits in ``limit`` tokens (the oldest are dropped)."""
    for first in range(len(conversation.sessions)):
        sessions = conversation.sessions[first:]
        if len(framing_for(sessions).start_ids()) <= limit:
            return sessions
    raise EvaluationError(f"{conversation.sample_id}: not even its last session fits in {limit} history tokens")


def evidence_inside(question: Question, window: set[int]) -> bool:
    """Whether every evidence session of ``question`` is among the sessions ``window`` (none: not visible)."""
    return bool(question.evidence_sessions) and question.evidence_sessions <= window


def turn_room(
    task: StreamTask, conversation: Conversation, framing: Framing, questions: list[Question], max_new_tokens: int
) -> int:
    """Tokens that the questions and gold answers of ``questions`` add, plus room for one generated answer."""
    room = max_new_tokens
    for question in questions:
        prompt, gold = task.question_prompt(conversation, question), task.gold_answer(question)
        room += len(framing.question_ids([], prompt)) + len(framing.answer_ids([], prompt, gold))
    return room + max_new_tokens * len(questions)


def file_sessions(
    task: StreamTask,
    conversation: Conversation,
    questions: list[Question],
    tokenizer: PreTrainedTokenizerBase,
    context: int,
    config: StreamConfig,
) -> list[Session]:
    """The sessions the file placement keeps: the newest that fit the history limit (by default the context
    less the room the questions and answers take)."""

    def framing_for(sessions: list[Session]) -> Framing:
        return Framing(tokenizer, task.text(conversation, sessions))

    limit = config.max_history_tokens
    if limit is None:
        room = turn_room(task, conversation, framing_for(conversation.sessions), questions, config.max_new_tokens)
        if room >= context:
            raise EvaluationError(
                f"{conversation.sample_id}: its {len(questions)} questions and answers take {room} tokens, more than "
                f"the model's context of {context}: ask fewer (--max-turns) or use --placement evidence"
            )
        limit = context - room
    return fit_sessions(framing_for, conversation, limit)


def newest_items(items: list[StreamItem], framing: Framing, budget: int) -> list[StreamItem]:
    """The newest whole sessions of the stream (each with the turns asked after it) that fit in ``budget`` tokens."""
    sizes = []
    for kind, content, _ in items:
        sizes.append(len(framing.encode(content if kind == "session" else " ".join(content))))
    starts = [i for i, (kind, _, _) in enumerate(items) if kind == "session"]
    for start in starts:
        if sum(sizes[start:]) <= budget:
            return items[start:]
    return []
