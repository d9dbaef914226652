"""LoCoMo as text: the conversation and the question prompts.

The wording re-implements the official harness from its description: a header naming the two speakers,
``DATE:`` / ``CONVERSATION:`` per session, ``<speaker> said, "<text>"`` per turn (image turns add
``and shared <caption>.``), a short-answer instruction, the temporal instruction for category 2, and
category 5 asked as a two-option choice in a seeded random order.
"""

from __future__ import annotations

import random
import re

from evaluation.protocols.streaming.episodes import Conversation, Question, Session

HEADER = (
    "Below is a conversation between {a} and {b}. It took place over several days, "
    "and the date of each session is written at its start.\n\n"
)
INSTRUCTION = (
    "Based on the conversation above, write a short answer to the question below. "
    "Use exact words from the conversation whenever possible."
)
TEMPORAL = " Use the DATE of the conversation to answer with an approximate date."
ABSTAIN = "Not mentioned in the conversation"


def render_session(session: Session) -> str:
    lines = [f"DATE: {session.date}", "CONVERSATION:"]
    for turn in session.turns:
        caption = f" and shared {turn.caption}." if turn.caption else ""
        lines.append(f'{turn.speaker} said, "{turn.text}"{caption}')
    return "\n".join(lines) + "\n\n"


def header(conversation: Conversation) -> str:
    return HEADER.format(a=conversation.speaker_a, b=conversation.speaker_b)


def render_conversation(conversation: Conversation, sessions: list[Session]) -> str:
    return header(conversation) + "".join(render_session(session) for session in sessions)


def choice_options(conversation: Conversation, question: Question) -> list[str]:
    """Category 5's two options (the adversarial answer and the abstention) in a seeded random order."""
    options = [question.adversarial_answer or str(question.answer), ABSTAIN]
    random.Random(f"{conversation.sample_id}:{question.index}").shuffle(options)
    return options


def question_prompt(conversation: Conversation, question: Question) -> str:
    text = question.question
    if question.category == 2:
        text += TEMPORAL
    if question.category == 5:
        first, second = choice_options(conversation, question)
        text += f" Select the correct answer: (a) {first} (b) {second}."
    return f"{INSTRUCTION}\n\nQuestion: {text} Short answer:"


def gold_answer(question: Question) -> str:
    """What the history records as the answer: the gold answer, or the abstention for unanswerable category 5."""
    return ABSTAIN if question.category == 5 and question.answer is None else str(question.answer)


def resolve_choice(prediction: str, options: list[str]) -> str:
    """A category 5 answer given as a letter ("(b)", "b)", "b") is scored as that option's text."""
    match = re.match(r"\s*\(?([ab])\)?(?:\s|\.|$)", prediction.lower())
    return options["ab".index(match.group(1))] if match else prediction
